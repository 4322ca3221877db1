// `remat tokenizer train` and `remat data prepare`: a corpus made ready for training.
#include "cli/commands.h"
#include "cli/config.h"

#include "train/shards.h"
#include "train/tokenizer.h"

#include <fmt/format.h>

namespace remat::cli {

int run_tokenizer_train(const Config& config) {
  const trainer::RunConfig& r = config.run;
  CHECK(!r.tokenizer.path.empty(), "`remat tokenizer train` needs tokenizer_path=FILE.model: where the model is written");
  train::train_tokenizer(r.data.corpus, r.model.vocab_size, config.tokenizer_algorithm, r.tokenizer.path);
  const train::Tokenizer trained({.type = "sentencepiece", .path = r.tokenizer.path});
  fmt::print("tokenizer: {} ({}) trained on {}\ntrain with: tokenizer_type=sentencepiece tokenizer_path={} vocab_size={}\n",
             trained.description(), config.tokenizer_algorithm,
             r.data.corpus.path.empty() ? train::kDefaultCorpus : r.data.corpus.path, r.tokenizer.path, trained.vocab_size());
  return 0;
}

int run_data_prepare(const Config& config) {
  const trainer::RunConfig& r = config.run;
  const train::Tokenizer tokenizer(r.tokenizer);
  const std::vector<std::filesystem::path> shards = train::prepare_shards(r.data.corpus, tokenizer, config.output_path);
  int64_t tokens = 0, documents = 0, bytes = 0;
  for (const std::filesystem::path& s : shards) {
    const train::ShardHeader h = train::open_shard(s, tokenizer.vocab_size()).header;
    tokens += h.tokens, documents += h.documents, bytes += h.text_bytes;
  }
  fmt::print("data: {} shards in {}: {} documents, {} tokens, {} bytes of text ({:.2f} bytes/token); tokenizer {}\n"
             "train with: dataset_type=tokens dataset_path={}{}\n",
             shards.size(), config.output_path, documents, tokens, bytes,
             tokens > 0 ? static_cast<double>(bytes) / static_cast<double>(tokens) : 0.0, tokenizer.description(),
             config.output_path,
             r.tokenizer.type == "byte" ? "" : fmt::format(" tokenizer_type={} tokenizer_path={} vocab_size={}",
                                                          r.tokenizer.type, r.tokenizer.path, tokenizer.vocab_size()));
  return 0;
}

}  // namespace remat::cli
