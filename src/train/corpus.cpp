#include "train/corpus.h"

#include "base/check.h"

#include <nlohmann/json.hpp>

#include <glob.h>

#include <algorithm>
#include <fstream>
#include <iterator>

namespace remat::train {

namespace fs = std::filesystem;

std::vector<fs::path> corpus_files(const std::string& path, const char* key) {
  const fs::path root = path.empty() ? fs::path(kDefaultCorpus) : fs::path(path);
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  } else if (fs::exists(root, ec)) {
    files.push_back(root);
  } else if (path.find_first_of("*?[") != std::string::npos) {
    glob_t matches{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &matches);
    for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i)
      if (fs::is_regular_file(matches.gl_pathv[i], ec)) files.emplace_back(matches.gl_pathv[i]);
    globfree(&matches);
    CHECK(!files.empty(), "{} '{}' is a pattern that matches no file", key, path);
  } else {
    CHECK(false, "{} '{}' does not exist; give a file, a folder or a glob pattern (e.g. 'data/*.jsonl')", key,
          root.string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& file, const char* key) {
  std::ifstream in(file, std::ios::binary);
  CHECK(in.good(), "cannot read file '{}' (config key {})", file.string(), key);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void for_each_document(const Corpus& corpus, const fs::path& file, const std::function<void(std::string_view)>& document) {
  CHECK(corpus.type == "text" || corpus.type == "jsonl", "dataset_type '{}' holds no text documents (file '{}')",
        corpus.type, file.string());
  if (corpus.type == "text") {
    document(read_file(file, "dataset_path"));
    return;
  }
  std::ifstream in(file);
  CHECK(in.good(), "cannot read file '{}' (config key dataset_path)", file.string());
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      CHECK(false, "'{}' line {} is not JSON ({}): each line of a dataset_type=jsonl file is one JSON object",
            file.string(), number, e.what());
    }
    const auto field = row.is_object() ? row.find(corpus.column) : row.end();
    CHECK(row.is_object() && field != row.end() && field->is_string(),
          "'{}' line {} has no string field '{}' (config key train_data_columns): set train_data_columns to the "
          "field that holds the text", file.string(), number, corpus.column);
    document(field->get_ref<const std::string&>());
  }
}

}  // namespace remat::train
