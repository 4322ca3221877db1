# libFuzzer harnesses, in their own build tree with clang-14 (../shared/reference §5):
#   CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DREMAT_FUZZ=ON && ninja -C build-fuzz
# The parsers' library code gets coverage and sanitizers without libFuzzer's main; each harness links it.
find_package(fmt REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json REQUIRED)

set(REMAT_FUZZ_SANITIZERS -g -O1 -mf16c -fno-omit-frame-pointer -fno-sanitize-recover=undefined)

# What the four parsers reach: the IR and its verifier, checkpoint names and the policy grammar, the model's
# config validation and precision grammar, arrays and the checkpoint reader, and the config loader.
file(GLOB REMAT_FUZZED_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/base/*.cpp ${CMAKE_SOURCE_DIR}/src/ir/*.cpp
     ${CMAKE_SOURCE_DIR}/src/nn/*.cpp)
list(APPEND REMAT_FUZZED_SOURCES ${CMAKE_SOURCE_DIR}/src/remat/policy.cpp ${CMAKE_SOURCE_DIR}/src/remat/region.cpp
     ${CMAKE_SOURCE_DIR}/src/exec/array.cpp
     ${CMAKE_SOURCE_DIR}/src/train/checkpoint.cpp ${CMAKE_SOURCE_DIR}/src/cli/config.cpp ${REMAT_EMBEDDED_CONFIGS})
add_library(remat_fuzzed STATIC ${REMAT_FUZZED_SOURCES})
target_include_directories(remat_fuzzed PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_compile_options(remat_fuzzed PRIVATE ${REMAT_FUZZ_SANITIZERS} -fsanitize=fuzzer-no-link,address,undefined)
target_link_libraries(remat_fuzzed PUBLIC fmt::fmt yaml-cpp nlohmann_json::nlohmann_json)

foreach(name config policy ir_text safetensors)
  add_executable(${name}_fuzz ${CMAKE_SOURCE_DIR}/fuzz/${name}_fuzz.cpp)
  target_compile_options(${name}_fuzz PRIVATE ${REMAT_FUZZ_SANITIZERS} -fsanitize=fuzzer,address,undefined)
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name}_fuzz PRIVATE remat_fuzzed)
endforeach()
