// A small FileCheck for golden IR tests. Directives live in `//` comments of the test file:
//   // CHECK: text        the next output line (at or after the cursor) containing `text`
//   // CHECK-NEXT: text   the line right after the previous match must contain `text`
//   // CHECK-NOT: text    no line between the previous and the next match contains `text` (so a CHECK-NOT
//                        right before a CHECK-NEXT checks nothing: put it before a CHECK)
// In `text`, `[[X:regex]]` binds X to what the regex matched (e.g. `[[W:%[0-9]+]]`), `[[X]]` matches X's
// bound text, `{{regex}}` matches a regex; everything else is literal.
// Returns "" on success, else a message naming the failed directive and the output.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace remat::testing_support {

std::string filecheck(std::string_view test_file_text, std::string_view output);

// The text after "// RUN:" in the test file, or "" if there is none.
std::string run_line(std::string_view test_file_text);

// Reads a whole file (test data); fails the test with the path when it cannot.
std::string read_file(const std::string& path);

// The paths of the files in tests/<dir> whose names end in `extension` (".ir"), sorted.
std::vector<std::string> golden_files(const std::string& dir, const std::string& extension);

}  // namespace remat::testing_support
