// `reprise serve` on the stories260K fixture for the SDK client tests: where
// the model and binary are, whether the test must skip, and a server on an
// ephemeral port started before the tests and stopped after them.
import { after, before } from "node:test";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const modelPath = resolve(repo, "../shared/fixtures/models/stories260K.gguf");
const binary = process.env.REPRISE_BIN ? resolve(process.env.REPRISE_BIN) : resolve(repo, "build/reprise");

export const model = "stories260K";

// A reason to skip (logged), or false.
export function skipReason(what) {
  const reason = !existsSync(modelPath)
    ? `../shared/fixtures/models/stories260K.gguf not found: ${what} test skipped`
    : !existsSync(binary)
      ? `reprise binary not found at ${binary} (set REPRISE_BIN)`
      : false;
  if (reason) console.log(`# SKIP: ${reason}`);
  return reason;
}

// Starts the server (requiring `apiKey`) before the file's tests, unless
// skipping, and calls onReady with its base URL (http://host:port); stops
// it after them.
export function serveForTests({ skip, apiKey, onReady }) {
  let server;
  let log = "";
  before(async () => {
    if (skip) return;
    const url = await new Promise((resolvePromise, reject) => {
      server = spawn(binary, ["serve", "-m", modelPath, "--port", "0", "-t", "1", "--api-key", apiKey,
                              "--parallel", "2", "--cache-ram", "64"],
                     { stdio: ["ignore", "ignore", "pipe"] });
      const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 30000);
      server.stderr.on("data", (chunk) => {
        log += chunk.toString();
        const match = log.match(/listening on (http:\/\/[^\s]+)/);
        if (match) {
          clearTimeout(timer);
          resolvePromise(match[1]);
        }
      });
      server.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`server exited with ${code}:\n${log}`));
      });
    });
    onReady(url);
  });
  after(() => {
    if (server && server.exitCode === null) server.kill("SIGTERM");
  });
}
