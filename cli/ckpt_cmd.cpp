#include "cli/ckpt_cmd.h"

#include <iostream>
#include <memory>

#include "core/util/atomic_file.h"
#include "core/ckpt/checkpoint.h"
#include "core/tensor/dtype.h"

namespace distlab {

void add_ckpt_commands(CLI::App& app, int& exit_code) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "look inside a checkpoint, or export its weights for PyTorch");
  ckpt->require_subcommand(1);

  struct InspectArgs {
    std::string path;
    bool json = false;
  };
  auto ia = std::make_shared<InspectArgs>();
  CLI::App* inspect = ckpt->add_subcommand("inspect", "step, strategy, world, tensors, bytes per category; every file's CRC-32 checked");
  inspect->add_option("dir", ia->path, "a step folder (DIR/step-000100) or a checkpoint.dir (its newest complete checkpoint)")->required();
  inspect->add_flag("--json", ia->json, "the manifest as JSON");
  inspect->callback([ia, &exit_code]() {
    nlohmann::json j;
    const std::string text = inspect_checkpoint(ia->path, &j);
    std::cout << (ia->json ? j.dump(1) + "\n" : text);
    exit_code = 0;
  });

  struct ExportArgs {
    std::string path, out, dtype = "f32";
    bool merge = false;
  };
  auto ea = std::make_shared<ExportArgs>();
  CLI::App* exp = ckpt->add_subcommand("export", "the full model weights as one safetensors file (PyTorch names and layouts)");
  exp->add_option("dir", ea->path, "a step folder or a checkpoint.dir")->required();
  exp->add_option("--out", ea->out, "the .safetensors file to write")->required();
  exp->add_option("--dtype", ea->dtype, "f32 (default), bf16 or f16");
  exp->add_flag("--merge", ea->merge, "a LoRA run's adapters folded into their base weights: the plain model under its Hugging Face names");
  exp->callback([ea, &exit_code]() {
    const DType d = parse_float_dtype(ea->dtype);
    check_output_path(ea->out, "--out");
    export_checkpoint(ea->path, ea->out, d, ea->merge);
    std::cout << "wrote " << ea->out << " (" << ea->dtype << (ea->merge ? ", LoRA merged" : "") << ") from " << resolve_checkpoint_path(ea->path) << "\n";
    exit_code = 0;
  });
}

}  // namespace distlab
