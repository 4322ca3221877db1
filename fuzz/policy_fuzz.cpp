// The remat policy parser on arbitrary text, under each naming and fusion (input format: fuzz/inputs.h).
// Property: a policy that parses has canonical text that parses to the same canonical text.
#include "fuzz.h"
#include "inputs.h"
#include "remat/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace remat;
  const fuzz::PolicyInput input = fuzz::policy_input(fuzz::text(data, size));
  fuzz::refused_or_accepted([&] {
    const rematerialize::Policy p = rematerialize::parse_policy(std::string(input.text), input.names);
    const rematerialize::Policy again = rematerialize::parse_policy(p.text, input.names);
    if (again.text != p.text) fuzz::broken("parse(p.text).text == p.text", p.text, again.text);
  });
  return 0;
}
