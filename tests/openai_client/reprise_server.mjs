// `reprise serve` on the stories260K fixture for the SDK client tests: where
// the model and binary are, whether the test must skip, and a server on an
// ephemeral port started before the tests and stopped after them.
import { after, before } from "node:test";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const modelPath = resolve(repo, "../shared/fixtures/models/stories260K.gguf");
const binary = process.env.REPRISE_BIN ? resolve(process.env.REPRISE_BIN) : resolve(repo, "build/reprise");

export const model = "stories260K";
// A synthetic LoRA adapter of the model the server offers under this name.
export const adapterModel = "stories260K-style";

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

// Starts the server (requiring `apiKey`, serving a synthetic LoRA adapter
// as adapterModel) before the file's tests, unless skipping, and calls
// onReady with its base URL (http://host:port); stops it after them.
export function serveForTests({ skip, apiKey, onReady }) {
  let server;
  let log = "";
  let scratch;
  before(async () => {
    if (skip) return;
    scratch = mkdtempSync(join(tmpdir(), "reprise-sdk-"));
    const adapter = join(scratch, "style.gguf");
    const made = spawnSync(binary, ["model", "lora", "-m", modelPath, "-o", adapter, "--strength", "2"],
                           { encoding: "utf8" });
    if (made.status !== 0) throw new Error(`reprise model lora failed:\n${made.stderr}`);
    const url = await new Promise((resolvePromise, reject) => {
      server = spawn(binary, ["serve", "-m", modelPath, "--port", "0", "-t", "1", "--api-key", apiKey,
                              "--parallel", "2", "--cache-ram", "64", "--lora", `${adapterModel}=${adapter}`],
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
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });
}
