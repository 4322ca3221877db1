#include "base/workers.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace remat {

void for_each_parallel(int64_t n, const std::function<void(int64_t)>& job, int64_t max_threads) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::min({n, cores, max_threads > 0 ? max_threads : cores});
  const int omp_threads = omp_get_max_threads();
  std::atomic<int64_t> next{0};
  std::vector<std::exception_ptr> failed(static_cast<size_t>(std::max<int64_t>(n, 0)));
  auto work = [&] {
    omp_set_num_threads(omp_threads);  // a new thread starts from the process's default
    for (int64_t i = next++; i < n; i = next++) {
      try {
        job(i);
      } catch (...) {
        failed[static_cast<size_t>(i)] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& h : helpers) h.join();
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace remat
