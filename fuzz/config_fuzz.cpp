// The config loader on an arbitrary YAML file and key=value overrides, exactly as `remat train FILE k=v ...`
// reads them (input format: fuzz/inputs.h). Property: nothing but a remat::Error (a message naming the key)
// ever escapes.
#include "cli/config.h"
#include "fuzz.h"
#include "inputs.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace {

// One folder per process for the config file (the loader reads a path, as the command does).
const std::string& config_file() {
  static const std::string path = [] {
    std::string dir = "/tmp/remat_config_fuzz_XXXXXX";
    if (!mkdtemp(dir.data())) std::abort();
    return dir + "/config.yml";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const remat::fuzz::ConfigInput input = remat::fuzz::config_input(remat::fuzz::text(data, size));
  std::ofstream(config_file(), std::ios::binary | std::ios::trunc) << input.yaml;
  remat::fuzz::refused_or_accepted([&] { remat::cli::load_config(config_file(), input.overrides); });
  return 0;
}
