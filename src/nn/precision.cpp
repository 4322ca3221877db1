#include "nn/precision.h"

#include "base/check.h"

#include <algorithm>
#include <cctype>
#include <optional>

namespace remat::nn {
namespace {

const char* kGrammar =
    "use jmp's grammar: 'params=float32,compute=bfloat16,output=float32' (keys params|p, compute|c, output|o; "
    "unset params are float32, compute follows params, output follows compute) or one dtype for all three; "
    "dtypes: float32|f32|full|single, bfloat16|bf16|half, float16|f16, float64|f64|double";

DType dtype_of(std::string name, const std::string& key, const std::string& text) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "float32" || name == "f32" || name == "full" || name == "single" || name == "float") return DType::f32;
  if (name == "bfloat16" || name == "bf16" || name == "half") return DType::bf16;
  if (name == "float16" || name == "f16") return DType::f16;
  if (name == "float64" || name == "f64" || name == "double") return DType::f64;
  CHECK(false, "config key '{}': unknown dtype '{}' in '{}'; {}", key, name, text, kGrammar);
  return DType::f32;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

std::string PrecisionPolicy::str() const {
  return fmt::format("p={},c={},o={}", dtype_name(param), dtype_name(compute), dtype_name(output));
}

PrecisionPolicy parse_precision(const std::string& text, const std::string& key) {
  CHECK(!trim(text).empty(), "config key '{}' is empty; {}", key, kGrammar);
  if (text.find('=') == std::string::npos) {
    DType d = dtype_of(trim(text), key, text);
    return PrecisionPolicy{d, d, d};
  }
  std::optional<DType> p, c, o;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    std::string item = trim(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    size_t eq = item.find('=');
    CHECK(eq != std::string::npos, "config key '{}': '{}' in '{}' is not key=dtype; {}", key, item, text, kGrammar);
    std::string k = trim(item.substr(0, eq));
    DType d = dtype_of(trim(item.substr(eq + 1)), key, text);
    std::optional<DType>* slot = k == "p" || k == "params"    ? &p
                                 : k == "c" || k == "compute" ? &c
                                 : k == "o" || k == "output"  ? &o
                                                              : nullptr;
    CHECK(slot != nullptr, "config key '{}': unknown key '{}' in '{}'; {}", key, k, text, kGrammar);
    CHECK(!slot->has_value(), "config key '{}': '{}' is given twice in '{}'", key, k, text);
    *slot = d;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  PrecisionPolicy r;
  r.param = p.value_or(DType::f32);
  r.compute = c.value_or(r.param);
  r.output = o.value_or(r.compute);
  return r;
}

int64_t Mesh::size(std::string_view axis) const {
  for (const auto& [name, n] : axes)
    if (name == axis) return n;
  return 1;
}

int64_t Mesh::ranks() const {
  int64_t r = 1;
  for (const auto& a : axes) r *= a.second;
  return r;
}

int64_t Mesh::batch_ranks() const { return ranks() / size("tensor"); }

std::string Mesh::batch_group() const {
  std::string g;
  for (const auto& [name, n] : axes)
    if (n > 1 && name != "tensor") g += (g.empty() ? "" : ",") + name;
  return g;
}

}  // namespace remat::nn
