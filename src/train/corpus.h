// A corpus on disk: which files a dataset_path names (a file, a folder, or a glob pattern) and the documents
// each file holds (dataset_type text: the whole file; jsonl: one per line, the train_data_columns field).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::train {

// The default corpus: the plain-text licenses every Debian system carries.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses";

struct Corpus {
  std::string type = "text";    // text | jsonl | tokens (shards of `remat data prepare`)
  std::string path;             // a file, a folder (every regular file under it) or a glob; "" = kDefaultCorpus
  std::string column = "text";  // jsonl: the field holding a document's text
};

// The files `path` names, in name order: the file itself, every regular file under a folder (symbolic links
// skipped so aliases are not read twice), or the matches of a glob pattern (*, ?, [...]). `key` names the
// config key in errors: a path that names no file is one.
std::vector<std::filesystem::path> corpus_files(const std::string& path, const char* key);

// Calls `document` with each document of `file` (a text or jsonl file of `corpus`), in order. A jsonl line
// that is not a JSON object with a string field `corpus.column` is an error naming the file and line; empty
// lines are skipped.
void for_each_document(const Corpus& corpus, const std::filesystem::path& file,
                       const std::function<void(std::string_view)>& document);

// The whole file's bytes; an error names the file and `key` where it cannot be read.
std::string read_file(const std::filesystem::path& file, const char* key);

}  // namespace remat::train
