// for_each_parallel: every job runs once, with the caller's OpenMP thread count, and a job's error reaches the
// caller (the lowest index's when several fail).
#include "base/check.h"
#include "base/workers.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace remat {
namespace {

TEST(Workers, EveryJobRunsOnceWithTheCallersOpenMpThreadCount) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);  // not the process's default: a new thread would start from that
  std::vector<std::atomic<int>> runs(50);
  std::vector<int> threads(50, 0);
  for_each_parallel(50, [&](int64_t i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // long enough for every thread to take some
    ++runs[static_cast<size_t>(i)];
    threads[static_cast<size_t>(i)] = omp_get_max_threads();
  });
  omp_set_num_threads(before);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].load(), 1) << i;
    EXPECT_EQ(threads[i], 3) << i;
  }
}

TEST(Workers, TheLowestFailingJobsErrorReachesTheCaller) {
  std::atomic<int> done{0};
  try {
    for_each_parallel(20, [&](int64_t i) {
      ++done;
      if (i == 7 || i == 13) throw std::runtime_error(std::to_string(i));
    });
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "7");
  }
  EXPECT_EQ(done.load(), 20);  // the others ran to the end
}

TEST(Workers, OneThreadRunsInOrder) {
  std::vector<int64_t> order;
  for_each_parallel(5, [&](int64_t i) { order.push_back(i); }, 1);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace remat
