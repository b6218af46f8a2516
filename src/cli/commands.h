// Subcommands of the `reprise` binary. Each registers itself on the app.
#pragma once
#include <string>

namespace CLI { class App; }

namespace reprise::cli {

void register_run(CLI::App& app);
void register_bench(CLI::App& app);
void register_eval(CLI::App& app);
void register_model(CLI::App& app);
void register_serve(CLI::App& app);

// The model `run` uses when -m is not given: a small synthetic model written
// once to the user's cache directory, so a fresh machine runs offline.
std::string default_model_path();

// Worker threads: the requested count, or all hardware threads when <= 0.
int resolve_threads(int requested);

}  // namespace reprise::cli
