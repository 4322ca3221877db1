// safetensors files: read back by a parser written here from the format's definition (not the engine's
// reader), and by Python's struct/json where Python is installed; corrupt, truncated and malformed files
// are refused naming the file and the fault; `remat train` falls back to the previous checkpoint when
// the latest is corrupt.
#include "exec/exec.h"
#include "nn/nn.h"
#include "train/checkpoint.h"
#include "support/command.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace remat {
namespace {

namespace fs = std::filesystem;

using testing_support::TempDir;

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string error_of(const fs::path& file) {
  try {
    train::read_safetensors(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<train::NamedArray> sample_tensors() {
  exec::Array w = exec::Array::from<float>({2, 3}, {1.5f, -2, 0.25f, 3, 1e-3f, -7});
  exec::Array step = exec::Array::from<int32_t>({}, {42});
  exec::Array empty(ir::Type{DType::f32, {0, 4}});
  exec::Array half(ir::Type{DType::bf16, {3}});
  for (int i = 0; i < 3; ++i) half.set(i, 0.5 * (i + 1));
  return {{"decoder/w", w}, {"step", step}, {"empty", empty}, {"half", half}};
}

// The format, parsed here from its definition: u64 LE header size, a JSON header, the data.
TEST(Safetensors, AnIndependentParserReadsWhatTheWriterWrote) {
  TempDir t;
  const fs::path file = t.path / "a.safetensors";
  const std::vector<train::NamedArray> tensors = sample_tensors();
  train::write_safetensors(file, tensors, {{"step", "42"}});
  const std::string raw = bytes_of(file);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(raw[static_cast<size_t>(i)])) << (8 * i);
  ASSERT_LE(8 + n, raw.size());
  EXPECT_EQ(n % 8, 0u) << "the data starts 8-byte aligned";
  EXPECT_EQ(raw[8], '{');
  const nlohmann::json header = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(header.at("__metadata__").at("step"), "42");
  EXPECT_EQ(header.at("__metadata__").at("checksum").get<std::string>().size(), 16u);
  const std::map<DType, std::string> names = {{DType::f32, "F32"}, {DType::i32, "I32"}, {DType::bf16, "BF16"}};
  uint64_t covered = 0;
  for (const train::NamedArray& a : tensors) {
    const nlohmann::json& h = header.at(a.name);
    EXPECT_EQ(h.at("dtype"), names.at(a.array.type().dtype)) << a.name;
    EXPECT_EQ(h.at("shape").get<std::vector<int64_t>>(), a.array.type().shape) << a.name;
    const uint64_t begin = h.at("data_offsets")[0], end = h.at("data_offsets")[1];
    ASSERT_EQ(end - begin, static_cast<uint64_t>(a.array.type().bytes())) << a.name;
    EXPECT_EQ(std::memcmp(raw.data() + 8 + n + begin, a.array.bytes(), end - begin), 0) << a.name;
    covered += end - begin;
  }
  EXPECT_EQ(8 + n + covered, raw.size()) << "no holes, nothing after the data";
  // And the engine's reader gives the same back.
  train::SafeTensors back = train::read_safetensors(file);
  for (const train::NamedArray& a : tensors)
    EXPECT_EQ(std::memcmp(back.tensors.at(a.name).bytes(), a.array.bytes(), static_cast<size_t>(a.array.type().bytes())), 0);
}

// Python's standard library (scripts/setup.sh installs python3): struct for the header size and the values, json
// for the header. It prints each tensor's first element exactly (repr), compared here with the engine's.
TEST(Safetensors, PythonReadsTheFile) {
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "no /usr/bin/python3: run scripts/setup.sh (it installs python3)";
  TempDir t;
  const fs::path file = t.path / "a.safetensors", script = t.path / "read.py";
  train::write_safetensors(file, sample_tensors(), {});
  std::ofstream(script) << "import json, struct, sys\n"
                           "raw = open(sys.argv[1], 'rb').read()\n"
                           "n, = struct.unpack('<Q', raw[:8])\n"
                           "h = json.loads(raw[8:8 + n])\n"
                           "fmt = {'F32': '<f', 'I32': '<i'}\n"
                           "for name in sorted(k for k in h if k != '__metadata__'):\n"
                           "    t = h[name]; b, e = t['data_offsets']\n"
                           "    if t['dtype'] in fmt and e > b:\n"
                           "        v, = struct.unpack_from(fmt[t['dtype']], raw, 8 + n + b)\n"
                           "        print(name, t['dtype'], t['shape'], repr(v))\n";
  const testing_support::Output o =
      testing_support::run_command(fmt::format("/usr/bin/python3 '{}' '{}'", script.string(), file.string()));
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(o.text, "decoder/w F32 [2, 3] 1.5\nstep I32 [] 42\n");
}

TEST(Safetensors, CorruptTruncatedAndMalformedFilesAreRefusedNamingTheFault) {
  TempDir t;
  const fs::path file = t.path / "a.safetensors";
  train::write_safetensors(file, sample_tensors(), {});
  const std::string good = bytes_of(file);
  auto variant = [&](std::string bytes) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    return error_of(file);
  };
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;
  EXPECT_NE(variant(flipped).find("checksum"), std::string::npos) << variant(flipped);
  EXPECT_NE(variant(good.substr(0, good.size() - 5)).find("truncated"), std::string::npos);
  EXPECT_NE(variant(good + "xx").find("trailing bytes"), std::string::npos);
  EXPECT_NE(variant(good.substr(0, 5)).find("too small"), std::string::npos);
  std::string huge = good;
  huge[7] = 0x7f;
  EXPECT_NE(variant(huge).find("over the 100000000 limit"), std::string::npos);
  std::string not_json = good;
  not_json[8] = '[';
  EXPECT_NE(variant(not_json).find("is not"), std::string::npos) << variant(not_json);
  // Seen while writing fuzz/safetensors_fuzz: 2^61 f64 elements are 2^64 bytes, which wrapped to the empty range [0, 0].
  const std::string header = R"({"x":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})";
  std::string wrapped(8, '\0');
  wrapped[0] = static_cast<char>(header.size());
  EXPECT_NE(variant(wrapped + header).find("more elements than the file has bytes"), std::string::npos)
      << variant(wrapped + header);
  EXPECT_EQ(variant(good), "") << "the intact file reads";
  EXPECT_NE(error_of(t.path / "none.safetensors").find("cannot read checkpoint file"), std::string::npos);
}

}  // namespace
}  // namespace remat
