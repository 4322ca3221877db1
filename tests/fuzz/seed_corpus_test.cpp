// Every seed of fuzz/corpus/ is an input its parser accepts, read the way its harness reads it
// (fuzz/inputs.h): the CI fuzz smoke run then starts from inputs that reach deep into each parser, and a
// grammar change that orphans a seed shows up here. Crash inputs kept as regression seeds (name starting
// `regression-`) are the exception: they must be refused with a message.
#include "cli/config.h"
#include "fuzz/inputs.h"
#include "ir/text.h"
#include "remat/policy.h"
#include "support/temp_dir.h"
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

namespace remat {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `parse` on every seed of fuzz/corpus/<name>; returns how many there were.
size_t each_seed(const std::string& name, const std::function<void(const std::string&)>& parse) {
  const fs::path dir = fs::path(REMAT_TEST_DATA) / ".." / "fuzz" / "corpus" / name;
  size_t seeds = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++seeds;
    const bool regression = e.path().filename().string().rfind("regression-", 0) == 0;
    SCOPED_TRACE(e.path().string());
    if (regression) {
      EXPECT_THROW(parse(read(e.path())), Error);
    } else {
      EXPECT_NO_THROW(parse(read(e.path())));
    }
  }
  return seeds;
}

TEST(FuzzSeeds, ConfigSeedsLoad) {
  testing_support::TempDir dir;
  const fs::path file = dir.path / "config.yml";
  EXPECT_GE(each_seed("config", [&](const std::string& bytes) {
              const fuzz::ConfigInput in = fuzz::config_input(bytes);
              std::ofstream(file, std::ios::binary) << in.yaml;
              cli::load_config(file.string(), in.overrides);
            }),
            5u);
}

TEST(FuzzSeeds, PolicySeedsParse) {
  EXPECT_GE(each_seed("policy",
                      [](const std::string& bytes) {
                        const fuzz::PolicyInput in = fuzz::policy_input(bytes);
                        rematerialize::parse_policy(std::string(in.text), in.names);
                      }),
            10u);
}

TEST(FuzzSeeds, IrTextSeedsParse) {
  EXPECT_GE(each_seed("ir_text", [](const std::string& bytes) { ir::parse(bytes, "seed.ir"); }), 5u);
}

TEST(FuzzSeeds, SafetensorsSeedsRead) {
  EXPECT_GE(each_seed("safetensors",
                      [](const std::string& bytes) {
                        std::istringstream in(bytes, std::ios::binary);
                        train::read_safetensors(in, bytes.size(), "seed.safetensors");
                      }),
            2u);
}

}  // namespace
}  // namespace remat
