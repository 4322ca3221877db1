#include "train/checkpoint_manager.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace remat::train {
namespace fs = std::filesystem;

namespace {

// `text` as a count (digits only, within int64), or -1.
int64_t count_of(const std::string& text) {
  int64_t n = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  return ec == std::errc() && end == text.data() + text.size() && n >= 0 ? n : -1;
}

// The state files in a folder (names starting "state" and ending ".safetensors"), in name order.
std::vector<std::string> state_files(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("state", 0) == 0 && name.ends_with(".safetensors")) files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A metadata field of a checkpoint; a file another safetensors writer left here may lack remat's metadata.
const std::string& field(const SafeTensors& s, const fs::path& file, const std::string& key) {
  const auto it = s.metadata.find(key);
  CHECK(it != s.metadata.end(), "checkpoint '{}' has no metadata '{}': not a checkpoint remat wrote", file.string(), key);
  return it->second;
}

int64_t count_field(const SafeTensors& s, const fs::path& file, const std::string& key) {
  const std::string& text = field(s, file, key);
  const int64_t n = count_of(text);
  CHECK(n >= 0, "checkpoint '{}': metadata '{}' is '{}', not a count: not a checkpoint remat wrote", file.string(), key,
        text);
  return n;
}

}  // namespace

bool is_state(ir::Role role) {
  return role == ir::Role::parameter || role == ir::Role::optimizer_state || role == ir::Role::loss_scale;
}

std::string CheckpointLayout::file(int64_t stage, int64_t shard, int64_t tensor) const {
  return fmt::format("state{}{}{}.safetensors", stages == 1 ? "" : fmt::format(".stage{}-of-{}", stage, stages),
                     shards == 1 ? "" : fmt::format(".fsdp{}-of-{}", shard, shards),
                     tensors == 1 ? "" : fmt::format(".tensor{}-of-{}", tensor, tensors));
}

std::vector<std::string> CheckpointLayout::files() const {
  std::vector<std::string> out;
  for (int64_t s = 0; s < stages; ++s)
    for (int64_t f = 0; f < shards; ++f)
      for (int64_t t = 0; t < tensors; ++t) out.push_back(file(s, f, t));
  return out;
}

std::vector<int64_t> CheckpointLayout::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder(), ec)) {
    const int64_t step = count_of(e.path().filename().string());  // digits beyond int64 name no step either
    if (e.is_directory(ec) && step >= 0) out.push_back(step);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

bool CheckpointLayout::complete(int64_t step) const {
  for (const std::string& f : files())
    if (std::error_code ec; !fs::is_regular_file(step_folder(step) / f, ec)) return false;
  return true;
}

CheckpointManager::CheckpointManager(CheckpointOptions options, const exec::Mesh& ranks)
    : options_(std::move(options)), ranks_(ranks) {}

fs::path CheckpointManager::file_of(int64_t step) const {
  return layout().step_folder(step) / layout().file(options_.stage, options_.shard, options_.tensor);
}

void CheckpointManager::save(const std::vector<StateTensor>& state, const Progress& progress, const Batcher& sampler) {
  const fs::path dir = layout().step_folder(progress.step);
  written_.insert(progress.step);
  if (options_.writer) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) {  // the new folder's entry reaches the disk before the file in it is trusted
      make_folder(dir, kWritableOutput);
      sync_folder(layout().folder());
    }
    std::vector<NamedArray> tensors;
    for (const StateTensor& t : state)
      if (is_state(t.role)) tensors.push_back({t.name, t.array});
    write_safetensors(file_of(progress.step), tensors,
                      {{"step", std::to_string(progress.step)},
                       {"skipped_steps", std::to_string(progress.skipped)},
                       {"train_sampler", sampler.state()},
                       {"config", nlohmann::json(options_.config_values).dump()}});
  }
  ranks_.all(true);  // every shard written
  if (ranks_.rank() != 0) return;
  CHECK(layout().complete(progress.step),
        "checkpoint {} lacks shard files after every rank wrote its own: the ranks do not share base_output_directory "
        "({}); FSDP, tensor-parallel and pipeline checkpoints need a filesystem all ranks share",
        dir.string(), layout().run_dir.string());
  prune(progress.step);
}

// Keeps the newest `keep` complete checkpoints; of the rest, deletes those this run owns older than `newest`.
void CheckpointManager::prune(int64_t newest) {
  int64_t kept = 0;
  for (int64_t s : layout().steps()) {
    if (layout().complete(s) && (options_.keep <= 0 || kept < options_.keep)) {
      ++kept;
    } else if (s < newest && owned(s)) {
      const fs::path d = layout().step_folder(s);
      std::error_code ec;
      fs::remove_all(d, ec);
      CHECK(!ec, "cannot delete old checkpoint '{}' (max_num_checkpoints_to_keep {}): {}", d.string(), options_.keep,
            ec.message());
    }
  }
}

void CheckpointManager::restore(const std::vector<StateTensor>& state, const SafeTensors& saved, const fs::path& file,
                                Restore what) const {
  std::vector<std::string> differing;
  if (auto it = saved.metadata.find("config"); it != saved.metadata.end()) {
    std::map<std::string, std::string> saved_config;
    try {
      saved_config = nlohmann::json::parse(it->second).get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      CHECK(false, "checkpoint '{}': its metadata 'config' is not a JSON object of strings ({}): not a file remat wrote",
            file.string(), e.what());
    }
    for (const auto& [k, v] : options_.config_values)
      if (auto j = saved_config.find(k); j != saved_config.end() && j->second != v)
        differing.push_back(fmt::format("{}: {} (checkpoint) vs {} (now)", k, j->second, v));
  }
  for (const StateTensor& a : state) {
    if (!is_state(a.role) || (what == Restore::parameters && a.role != ir::Role::parameter)) continue;
    auto t = saved.tensors.find(a.name);
    CHECK(t != saved.tensors.end() && t->second.type() == a.array.type(),
          "checkpoint '{}' does not fit this model: {} is {} there and {} here; differing config keys: {}", file.string(),
          a.name, t == saved.tensors.end() ? "missing" : ir::type_str(t->second.type()), ir::type_str(a.array.type()),
          differing.empty() ? "none" : fmt::format("{}", fmt::join(differing, "; ")));
    exec::Array to = a.array;  // a view of the step's buffer
    std::memcpy(to.bytes(), t->second.bytes(), static_cast<size_t>(t->second.type().bytes()));
    // A scale saved when loss_scale_min could be below 1 is raised to the floor: the step's finiteness check and
    // unscaling assume a scale >= 1 (train/step.h).
    if (a.role == ir::Role::loss_scale && a.name == "loss_scale") to.set(0, std::max(to.get(0), options_.min_loss_scale));
  }
}

void CheckpointManager::load_parameters(const std::vector<StateTensor>& state, const fs::path& path) const {
  fs::path file = path;
  if (std::error_code ec; fs::is_directory(file, ec)) file /= layout().file(options_.stage, options_.shard, options_.tensor);
  restore(state, read_safetensors(file), file, Restore::parameters);
}

Progress CheckpointManager::resume(const std::vector<StateTensor>& state, Batcher& sampler) {
  std::vector<std::string> unreadable;  // this rank's
  const std::vector<std::string> mine = layout().files();
  for (int64_t s : layout().steps()) {
    const fs::path dir = layout().step_folder(s), file = file_of(s);
    // Decided from the folder's listing, the same on every rank: files of this mesh, even some missing (a
    // write that never finished), are this run's; only files of another mesh are refused.
    const std::vector<std::string> files = state_files(dir);
    CHECK(files.empty() || std::any_of(files.begin(), files.end(),
                                       [&](const std::string& f) { return std::count(mine.begin(), mine.end(), f) > 0; }),
          "checkpoint {} was written by another mesh ({}), this run's rank {} needs {}: resume with the "
          "ici/dcn_fsdp_parallelism, tensor and pipeline keys it was saved with (a checkpoint is not resharded), or start a new "
          "run_name",
          dir.string(), fmt::join(files, ", "), ranks_.rank(), file.filename().string());
    SafeTensors saved;
    bool ok = layout().complete(s);  // else never finished
    if (ok) {
      try {
        saved = read_safetensors(file);
      } catch (const Error& e) {
        fmt::print("warning: {}; trying the previous checkpoint\n", e.what());
        unreadable.push_back(file.string());
        ok = false;
      }
    }
    if (!ranks_.all(ok)) continue;  // every rank resumes from the same step, or none does
    restore(state, saved, file, Restore::state);
    sampler.restore(field(saved, file, "train_sampler"));
    const Progress p{count_field(saved, file, "step"), count_field(saved, file, "skipped_steps")};
    fmt::print("resumed from {} (step {})\n", file.string(), p.step);
    resumed_ = p.step;
    return p;
  }
  CHECK(ranks_.all(unreadable.empty()),
        "every checkpoint of run '{}' is unreadable{}: {}; remat does not start the run again from step 0 over them. "
        "Choose another run_name, or delete them (or the folder {}) to start this run afresh",
        layout().run_dir.string(), ranks_.size() > 1 ? fmt::format(" (rank {})", ranks_.rank()) : "",
        unreadable.empty() ? std::string("another rank's files") : fmt::format("{}", fmt::join(unreadable, ", ")),
        layout().folder().string());
  return {};
}

}  // namespace train
