#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

namespace remat::train {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference reader's anti-DoS limit

uint64_t fnv1a(const std::byte* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint64_t>(p[i])) * 0x100000001b3ull;
  return h;
}

void write_all(int fd, const void* data, size_t n, const fs::path& file) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    CHECK(w > 0, "cannot write checkpoint file '{}': {}", file.string(), std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(fd >= 0, "cannot open folder '{}' to sync it: {}", folder.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  CHECK(rc == 0, "cannot sync folder '{}' to disk: {}", folder.string(), std::strerror(errno));
}

void make_folder(const fs::path& folder, const std::string& hint) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  CHECK(!ec, "cannot create folder '{}': {}; {}", folder.string(), ec.message(), hint);
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::trunc);
  CHECK(out.good(), "cannot write file '{}': {}", file.string(), std::strerror(errno));
  out << text;
  out.flush();
  CHECK(out.good(), "cannot write file '{}' (disk full?): {}", file.string(), std::strerror(errno));
}

std::string safetensors_dtype(DType d) {
  switch (d) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::pred: return "BOOL";
  }
  return "?";
}

void write_safetensors(const fs::path& file, const std::vector<NamedArray>& tensors,
                       std::map<std::string, std::string> metadata) {
  nlohmann::ordered_json header;
  uint64_t offset = 0, checksum = 0xcbf29ce484222325ull;
  std::set<std::string> names;
  for (const NamedArray& t : tensors) {
    ASSERT(t.name != "__metadata__" && names.insert(t.name).second);
    const uint64_t bytes = static_cast<uint64_t>(t.array.type().bytes());
    header[t.name] = {{"dtype", safetensors_dtype(t.array.type().dtype)},
                      {"shape", t.array.type().shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    checksum = fnv1a(t.array.bytes(), static_cast<size_t>(bytes), checksum);
  }
  metadata["checksum"] = fmt::format("{:016x}", checksum);
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));  // little-endian

  const fs::path tmp = file.parent_path() / (file.filename().string() + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CHECK(fd >= 0, "cannot create checkpoint file '{}': {}", tmp.string(), std::strerror(errno));
  try {
    write_all(fd, length, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const NamedArray& t : tensors) write_all(fd, t.array.bytes(), static_cast<size_t>(t.array.type().bytes()), tmp);
    CHECK(::fsync(fd) == 0, "cannot sync checkpoint file '{}' to disk: {}", tmp.string(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  CHECK(::rename(tmp.c_str(), file.c_str()) == 0, "cannot rename '{}' to '{}': {}", tmp.string(), file.string(),
        std::strerror(errno));
  sync_folder(file.parent_path().empty() ? fs::path(".") : file.parent_path());
}

SafeTensors read_safetensors(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  CHECK(in.good(), "cannot read checkpoint file '{}'", file.string());
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  return read_safetensors(in, size, fmt::format("checkpoint file '{}' ({} bytes)", file.string(), size));
}

SafeTensors read_safetensors(std::istream& in, uint64_t size, const std::string& what) {
  CHECK(size >= 8, "{} is too small for a safetensors header", what);
  unsigned char length[8];
  in.read(reinterpret_cast<char*>(length), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  CHECK(n <= kMaxHeader, "{}: its header claims {} bytes (over the {} limit)", what, n, kMaxHeader);
  CHECK(8 + n <= size, "{}: its header claims {} bytes, past the end of the file (truncated?)", what, n);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    CHECK(false, "{}: its header is not valid JSON: {}", what, e.what());
  }
  CHECK(header.is_object(), "{}: its header is not a JSON object", what);
  SafeTensors out;
  struct Entry {
    uint64_t begin, end;
    std::string name;
    ir::Type type;
  };
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      CHECK(value.is_object(), "{}: __metadata__ is not an object", what);
      for (const auto& [k, v] : value.items()) {
        CHECK(v.is_string(), "{}: __metadata__ value '{}' is not a string", what, k);
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", what, name);
    CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") && value.contains("data_offsets"),
          "{} needs dtype, shape and data_offsets", where);
    CHECK(value["dtype"].is_string() && value["shape"].is_array() && value["data_offsets"].is_array() &&
              value["data_offsets"].size() == 2,
          "{}: malformed dtype, shape or data_offsets", where);
    Entry e{0, 0, name, {}};
    const std::string dtype = value["dtype"];
    bool known = false;
    for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32, DType::pred})
      if (safetensors_dtype(d) == dtype) e.type.dtype = d, known = true;
    CHECK(known, "{}: dtype '{}' is not one remat reads (F64, F32, BF16, F16, I32, BOOL)", where, dtype);
    uint64_t elements = 1;
    for (const auto& d : value["shape"]) {
      CHECK(d.is_number_unsigned(), "{}: a shape entry is not a non-negative integer", where);
      const uint64_t dim = d.get<uint64_t>();
      // Bounded by the file: no product below can overflow, and no array larger than the file is allocated.
      CHECK(dim <= static_cast<uint64_t>(INT64_MAX) && (dim == 0 || elements <= size / dim),
            "{}: its shape holds more elements than the file has bytes", where);
      elements *= dim;
      e.type.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : value["data_offsets"]) CHECK(o.is_number_unsigned(), "{}: a data offset is not a non-negative integer", where);
    e.begin = value["data_offsets"][0];
    e.end = value["data_offsets"][1];
    CHECK(e.begin <= e.end && e.end - e.begin == elements * static_cast<uint64_t>(dtype_size(e.type.dtype)),
          "{}: data_offsets [{}, {}] do not hold {} x {}", where, e.begin, e.end, ir::shape_str(e.type.shape), dtype);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  for (const Entry& e : entries) {
    CHECK(e.begin == at, "{}: tensor '{}' starts at {}, not at {} (a hole or an overlap)", what, e.name, e.begin, at);
    at = e.end;
  }
  CHECK(8 + n + at == size, "{}: the tensors end at byte {} of the data, the file holds {} (truncated or trailing bytes)",
        what, at, size - 8 - n);
  uint64_t checksum = 0xcbf29ce484222325ull;
  for (const Entry& e : entries) {
    exec::Array a(e.type);
    in.read(reinterpret_cast<char*>(a.bytes()), static_cast<std::streamsize>(e.end - e.begin));
    CHECK(in.good() || e.end == e.begin, "{}: cannot read tensor '{}'", what, e.name);
    checksum = fnv1a(a.bytes(), static_cast<size_t>(e.end - e.begin), checksum);
    out.tensors.emplace(e.name, std::move(a));
  }
  if (auto it = out.metadata.find("checksum"); it != out.metadata.end())
    CHECK(it->second == fmt::format("{:016x}", checksum), "{}: checksum {} does not match the data ({:016x}): corrupt",
          what, it->second, checksum);
  return out;
}

}  // namespace remat::train
