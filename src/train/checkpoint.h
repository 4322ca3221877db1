// Checkpoint files in the safetensors format (the ecosystem's: an 8-byte little-endian header length, a
// JSON header of dtype / shape / data_offsets per tensor plus string `__metadata__`, then the raw
// little-endian bytes, tensors packed in order without holes), written atomically and checksummed.
// Invariants: a file is replaced only by rename after its bytes and its directory entry are on disk, so a
// crash at any instant leaves the previous complete file or the new one; the metadata key `checksum`
// (FNV-1a 64 of the data bytes, hex) is verified on every read.
//
//   train::write_safetensors(dir / "state.safetensors", {{"w", w}}, {{"step", "12"}});
//   train::SafeTensors s = train::read_safetensors(dir / "state.safetensors");   // CHECKs name the file
#pragma once

#include "exec/array.h"

#include <filesystem>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace remat::train {

struct NamedArray {
  std::string name;
  exec::Array array;
};

struct SafeTensors {
  std::map<std::string, exec::Array> tensors;
  std::map<std::string, std::string> metadata;  // the checksum included
};

// Writes `tensors` (names unique, not "__metadata__") and `metadata` (plus `checksum`) to `file`
// atomically: a temporary file in the same folder, fsync, rename over `file`, fsync of the folder.
void write_safetensors(const std::filesystem::path& file, const std::vector<NamedArray>& tensors,
                       std::map<std::string, std::string> metadata);

// Reads and validates a file written by any safetensors writer (header size and bounds, dtypes, shapes
// against byte ranges, offsets covering the data without holes or overlaps, nothing after them) and, when
// the metadata has one, the checksum. Every error names the file and what is wrong.
SafeTensors read_safetensors(const std::filesystem::path& file);
// The same from a stream of `size` bytes; `what` names them in errors.
SafeTensors read_safetensors(std::istream& in, uint64_t size, const std::string& what);

// Makes `folder`'s entries durable (fsync of the folder): after creating a folder, sync its parent.
void sync_folder(const std::filesystem::path& folder);

// Creates `folder` and its parents. A failure is a CHECK naming the folder, the reason and `hint` (how to fix it).
void make_folder(const std::filesystem::path& folder, const std::string& hint);

// Writes `text` to `file`, replacing it. A failure is a CHECK naming the file and the reason.
void write_text(const std::filesystem::path& file, const std::string& text);

// The safetensors dtype string of a dtype ("F32", "BF16", "I32", "BOOL", ...).
std::string safetensors_dtype(DType d);

}  // namespace remat::train
