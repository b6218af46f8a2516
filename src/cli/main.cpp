// reprise: a thin CLI over libreprise.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"reprise: a cache-first inference server for GGUF models"};
  app.require_subcommand(1);
  reprise::cli::register_run(app);
  reprise::cli::register_bench(app);
  reprise::cli::register_eval(app);
  reprise::cli::register_model(app);
  reprise::cli::register_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const reprise::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
