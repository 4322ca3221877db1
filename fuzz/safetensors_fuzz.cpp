// The checkpoint reader on arbitrary bytes. Property: a file it accepts is consistent: every tensor holds
// exactly its shape's bytes, and a `checksum` in the metadata matched (else the read would have failed).
#include "fuzz.h"
#include "train/checkpoint.h"

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace remat;
  std::istringstream in(std::string(fuzz::text(data, size)), std::ios::binary);
  fuzz::refused_or_accepted([&] {
    const train::SafeTensors s = train::read_safetensors(in, size, "fuzz.safetensors");
    size_t bytes = 0;
    for (const auto& [name, array] : s.tensors) bytes += static_cast<size_t>(array.type().bytes());
    if (bytes > size) fuzz::broken("the tensors fit in the file", std::to_string(bytes), std::to_string(size));
  });
  return 0;
}
