// `remat plan` under interleaved 1F1B: each rank's messages, counted from the virtual stages it owns. With p
// ranks and v chunks, rank r runs virtual stages r, r + p, ..., r + (v-1)p of K = p·v; per microbatch a virtual
// stage k sends its activation to k + 1 (k < K - 1) and its input's gradient to k - 1 (k > 0), and receives the
// same from them. So rank r sends m·(2v - [r = p-1] - [r = 0]) messages and receives as many, each one
// microbatch's activation [B, T, D] in f32; the bubble of equal chunks is (p-1)/(v·m + p-1).
#include "support/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace remat {
namespace {

TEST(PipelineCli, InterleavedRanksSendAndReceiveTheirVirtualStagesMessages) {
  const int p = 4, m = 8, v = 2;
  const testing_support::Output o = testing_support::run_command(fmt::format(
      "'{}' plan base_num_decoder_layers={} ici_pipeline_parallelism={} num_pipeline_microbatches={} "
      "num_pipeline_repeats={} pipeline_schedule=interleaved_1f1b num_layers_per_pipeline_stage=1 --json 2>&1",
      REMAT_BINARY, p * v, p, m, v));
  ASSERT_EQ(o.status, 0) << o.text;
  const nlohmann::json ranks = nlohmann::json::parse(o.text).at("pipeline").at("ranks");
  ASSERT_EQ(ranks.size(), static_cast<size_t>(p));
  // base.yml: per_device_batch_size 16 x 4 ranks / 8 microbatches = 8 sequences of 128 tokens, D = 128, f32.
  const double message = 4.0 * 8 * 128 * 128;
  for (int r = 0; r < p; ++r) {
    const nlohmann::json& comm = ranks[static_cast<size_t>(r)].at("communication").at("by_op");
    const int messages = m * (2 * v - (r == p - 1) - (r == 0));
    for (const char* op : {"send", "recv"}) {
      ASSERT_TRUE(comm.contains(op)) << "rank " << r << ": " << comm.dump();
      EXPECT_EQ(comm.at(op).at("count").get<int>(), messages) << op << " rank " << r;
      EXPECT_EQ(comm.at(op).at("bytes").get<double>(), messages * message) << op << " rank " << r;
    }
    EXPECT_NEAR(ranks[static_cast<size_t>(r)].at("bubble").get<double>(), (p - 1.0) / (v * m + p - 1.0), 1e-12)
        << "rank " << r;
  }
}

}  // namespace
}  // namespace remat
