// A run's checkpoints: where they live, which to keep, and which one a run resumes from. The files are
// train/checkpoint.h's safetensors, one per pipeline stage, FSDP shard and tensor block in a folder per step:
//
//   <run_dir>/checkpoints/<step>/state.safetensors                        one stage, one shard
//   <run_dir>/checkpoints/<step>/state.stage1-of-4.fsdp0-of-2.safetensors  otherwise (.tensor1-of-2 under tensor
//                                                                          parallelism)
//
// Each file holds this rank's state tensors (parameters, moments, loss-scale state) and the metadata `step`,
// `skipped_steps`, `train_sampler` (the Batcher's state) and `config` (every config key's value, JSON).
// Invariants: a step folder is a checkpoint when it holds every file of the mesh (else a write that never
// finished); every rank resumes from the same step or none does; a run deletes only checkpoints it owns (its
// history up to the one it resumed from, and those it wrote since), never a newer one it passed over.
//
//   train::CheckpointManager checkpoints({.layout = {.run_dir = dir}, .keep = 2}, mesh);
//   const train::Progress from = checkpoints.resume(state, batcher);   // {0, 0} when there is none
//   checkpoints.save(state, {.step = 100, .skipped = 0}, batcher);
#pragma once

#include "exec/mesh.h"
#include "ir/signature.h"
#include "train/checkpoint.h"
#include "train/data.h"

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace remat::train {

// The hint of an error writing into the run's folder.
inline constexpr const char* kWritableOutput =
    "set base_output_directory (and run_name) to a folder this process can write";

// The files of a run's checkpoints under a mesh of `stages` pipeline stages, `shards` FSDP shards and `tensors`
// tensor-parallel blocks.
struct CheckpointLayout {
  std::filesystem::path run_dir;
  int64_t stages = 1;
  int64_t shards = 1;
  int64_t tensors = 1;

  std::filesystem::path folder() const { return run_dir / "checkpoints"; }
  std::filesystem::path step_folder(int64_t step) const { return folder() / std::to_string(step); }
  // Every state file of a checkpoint, in the order of the ranks holding them (stage major).
  std::vector<std::string> files() const;
  std::string file(int64_t stage, int64_t shard, int64_t tensor = 0) const;
  // The step folders under folder(), newest first (names of digits only; anything else is not a step).
  std::vector<int64_t> steps() const;
  // Whether the folder of `step` holds every file of this layout.
  bool complete(int64_t step) const;
};

// A tensor of the step's state: the step's argument buffer itself (a view), its name and role.
struct StateTensor {
  std::string name;
  ir::Role role;
  exec::Array array;
};

// Whether an argument of that role carries state from one step to the next (and so is saved).
bool is_state(ir::Role role);

// What a checkpoint holds besides the tensors.
struct Progress {
  int64_t step = 0;     // updates done
  int64_t skipped = 0;  // steps skipped by loss scaling
};

// What `restore` copies: every state tensor (resume), or the parameters alone (load_parameters_path).
enum class Restore { state, parameters };

struct CheckpointOptions {
  CheckpointLayout layout;
  int64_t stage = 0;       // this rank's pipeline stage
  int64_t shard = 0;       // this rank's FSDP shard
  int64_t tensor = 0;      // this rank's tensor-parallel block
  bool writer = true;      // the first of its file's data-parallel replicas (which hold the same bits)
  int64_t keep = 2;        // complete checkpoints kept (older ones this run owns are deleted); 0: all
  std::map<std::string, std::string> config_values;  // saved; on a mismatch, the differing keys are named
  double min_loss_scale = 1;  // a restored loss scale is raised to it (train/step.h: the scale is >= 1)
};

class CheckpointManager {
 public:
  // Every rank of `ranks` makes one; `ranks` only synchronises them.
  CheckpointManager(CheckpointOptions options, const exec::Mesh& ranks);

  // Every rank calls it: the writers write their files of checkpoint `progress.step`; once all are written,
  // rank 0 checks the folder is complete and deletes the checkpoints this run owns beyond the newest `keep`.
  void save(const std::vector<StateTensor>& state, const Progress& progress, const Batcher& sampler);
  // Continues from the newest complete checkpoint every rank can read: a torn or corrupt one is reported and
  // the one before tried. Returns its progress ({0, 0} when there is none) and restores `state` and `sampler`.
  // Refuses a checkpoint of another mesh, and refuses when every checkpoint is unreadable (starting again at
  // step 0 would overwrite them).
  Progress resume(const std::vector<StateTensor>& state, Batcher& sampler);
  // Copies the parameters saved at `path` (a state file, or a step folder: this rank's file in it).
  void load_parameters(const std::vector<StateTensor>& state, const std::filesystem::path& path) const;
  // Copies the tensors of `saved` (read from `file`) into `state`'s of the same names; a missing tensor or one
  // of another type is refused, naming the config keys whose values differ from the checkpoint's.
  void restore(const std::vector<StateTensor>& state, const SafeTensors& saved, const std::filesystem::path& file,
               Restore what) const;

  const CheckpointLayout& layout() const { return options_.layout; }
  // This rank's file in the folder of `step`.
  std::filesystem::path file_of(int64_t step) const;

 private:
  bool owned(int64_t step) const { return step <= resumed_ || written_.count(step) > 0; }
  void prune(int64_t newest);

  CheckpointOptions options_;
  const exec::Mesh& ranks_;
  int64_t resumed_ = 0;        // the step resumed from: checkpoints up to it are this run's history
  std::set<int64_t> written_;  // the steps this run saved
};

}  // namespace remat::train
