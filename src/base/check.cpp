#include "base/check.h"

namespace remat {

void throw_error(std::string message) { throw Error(std::move(message)); }

void throw_internal(const char* condition, const char* file, int line) {
  throw InternalError(fmt::format("internal error (a bug in remat): {} failed at {}:{}", condition, file, line));
}

}  // namespace remat
