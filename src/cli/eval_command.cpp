// reprise eval: golden-format JSON (tokens, top-8 per position, last logits,
// greedy continuation) for every prompt of a prompts file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "engine/prompt_eval.h"
#include "util/error.h"
#include "util/read_file.h"

namespace reprise::cli {

void register_eval(CLI::App& app) {
  struct Options {
    std::string model, prompts_file, json_out;
    int threads = 0;
    int n_greedy = 24;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("eval", "Write golden-format outputs for a prompts file");
  cmd->add_option("-m,--model", o->model, "GGUF model")->required();
  cmd->add_option("-f,--file", o->prompts_file, "Prompts file (prompts separated by '-----' lines)")->required();
  cmd->add_option("--json", o->json_out, "Output JSON path (logits files are written beside it)")->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: one per physical core this process may use)");
  cmd->add_option("--greedy", o->n_greedy, "Greedy tokens per prompt")->capture_default_str();
  cmd->callback([o] {
    namespace fs = std::filesystem;
    const std::optional<std::string> prompts = read_whole_file(o->prompts_file);
    if (!prompts) throw Error(o->prompts_file + ": cannot open prompts file");
    auto bundle = load_model_bundle(o->model, [](const std::string& s) { std::fprintf(stderr, "[load] %s\n", s.c_str()); });
    ThreadPool pool(resolve_threads(o->threads));
    std::vector<PromptEvaluation> evals;
    for (const std::string& text : split_prompts_file(*prompts)) {
      evals.push_back(evaluate_prompt(*bundle, text, o->n_greedy, pool));
      if (static_cast<int64_t>(evals.back().tokens.size()) >= bundle->model->info().n_ctx_train)
        throw Error("prompt " + std::to_string(evals.size() - 1) + " is longer than the context");
    }
    fs::path out(o->json_out);
    const std::string stem = out.stem().string();
    auto j = evaluations_to_json(fs::path(o->model).filename().string(), bundle->model->info().n_vocab, evals, stem);
    for (size_t i = 0; i < evals.size(); ++i) {
      fs::path lf = out.parent_path() / j["prompts"][i]["last_logits_file"].get<std::string>();
      std::ofstream f(lf, std::ios::binary);
      f.write(reinterpret_cast<const char*>(evals[i].last_logits.data()), evals[i].last_logits.size() * sizeof(float));
      if (!f) throw Error(lf.string() + ": cannot write");
    }
    std::ofstream f(out);
    f << j.dump() << "\n";
    if (!f) throw Error(out.string() + ": cannot write");
    std::fprintf(stderr, "wrote %zu prompts to %s\n", evals.size(), out.c_str());
  });
}

}  // namespace reprise::cli
