// Configuration in MaxText's convention: a YAML base config that documents every key,
// a model preset (configs/models/<model>.yml) applied over it, then key=value overrides.
//   remat train configs/base.yml model=tiny steps=200 scan_layers=false
// Unknown keys, values of the wrong type and unknown presets are errors that name the key, where it
// came from, and what is allowed.
#pragma once

#include "trainer/trainer.h"

#include <map>
#include <string>
#include <vector>

namespace remat::cli {

struct Config {
  trainer::RunConfig run;
  std::string remat_policy = "full";          // as written; parsed into run.model.remat_policy
  std::string group_remat_policy = "nothing_saveable";  // as written; parsed into run.model.group_remat_policy
  std::string pipeline_stage_remat_policies;  // as written (comma-separated); parsed into run.model.stage_remat_policies
  std::map<std::string, std::string> custom_remat;  // checkpoint name -> remat|device|offload (remat_policy=custom)
  std::string model = "tiny";                 // preset name (configs/models/<model>.yml)
  std::string run_name;                       // "" = the model name
  std::string base_output_directory = "runs"; // runs go to <base_output_directory>/<run_name>
  std::string hbm_limit;                      // device memory for `remat plan` ("16GiB"); "" = no limit
  std::string host_limit;                     // host memory for offloaded residuals (remat_policy=auto); "" = no limit
  std::string host_bandwidth;                 // bytes/s of offload copies for auto's cost ("25GB"); "" = measured
  std::string ici_bandwidth;                  // bytes/s a device sends in collectives, for auto's cost; "" = measured
  bool search_layers_per_group = false;       // `--layers-per-group` (remat_policy=auto): the group size searched too
  std::string mp_policy;                      // jmp grammar; "" = params=weight_dtype, compute=output=dtype
  std::string dtype = "float32";              // MaxText's activation/compute dtype
  std::string weight_dtype = "float32";       // MaxText's parameter dtype
  std::string attention = "dot_product";      // MaxText's: dot_product (primitives) or flash (one fused op)
  std::string mp_cast = "per_layer";          // where weights are cast: per_layer (in the scan body) or upfront
  std::string checkpoint_naming = "maxtext";  // the names the layer's tensors carry: maxtext | axlearn
  std::string tokenizer_algorithm = "bpe";    // `remat tokenizer train`: bpe | unigram
  std::string output_path;                    // `remat data prepare`: the folder the shards go to
  // What it was loaded from (load_config's arguments): a variant is the same load with more overrides after these.
  std::string config_path;
  std::vector<std::string> overrides;
};

// Every key the config accepts, in documentation order.
std::vector<std::string> config_keys();

// Loads the built-in configs/base.yml, then `config_path` over it (a YAML file anywhere; "" for none), the
// model preset (models/<model>.yml beside `config_path` if there is one, else the built-in one), then
// `overrides` ("key=value" strings). Fills run.run_dir.
Config load_config(const std::string& config_path, const std::vector<std::string>& overrides);

// `config` loaded again as its command line was, with `more` ("key=value") after its own overrides; the run's
// dump_ir_after is kept.
Config with_overrides(const Config& config, const std::vector<std::string>& more);

// A comma-separated list of values, where a comma inside (), [] or quotes separates nothing (policy texts have
// them): "full,save_only_these_names(a, b)" -> {"full", "save_only_these_names(a, b)"}. "" -> {""}.
std::vector<std::string> split_values(const std::string& text);

// configs/ as built into the binary, by path relative to it: "base.yml", "models/tiny.yml", ...
const std::map<std::string, std::string>& embedded_configs();

}  // namespace remat::cli
