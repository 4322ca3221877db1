# Entry points. `make run` trains the built-in default; `make test` builds and runs every test
# (also under AddressSanitizer + UndefinedBehaviorSanitizer) and a short fuzz run of each parser (clang-14's
# libFuzzer, its own build tree). Both install missing Debian packages first.
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 15
JOBS ?= $(shell nproc)

.PHONY: setup build run test test-fast test-asan test-fuzz bench clean

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/build.ninja
	ninja -C $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/remat train

# One process runs every test (ctest would start one per test: ~5x slower here, the libraries' start-up each time).
test-fast: build
	$(BUILD)/remat_tests --gtest_brief=1

$(ASAN_BUILD)/build.ninja:
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_SANITIZE=ON

# The sanitizer build runs every test but these, which the release build runs (test-fast): brute-force searches
# of hundreds or thousands of plans (their searches run under the sanitizers in Models/AutoPolicy and
# PipelineCli), an auto search trained twice through the CLI (31 s under ASan), and a failed operator new, which
# ASan's runtime turns into an abort instead of std::bad_alloc.
RELEASE_ONLY = AutoPolicy.TheGroupSizeSearchedTooEqualsTheBruteForceOverEverySize:$\
	AutoPolicy.TheMemoryBoundSparesThePlannerTheCandidatesItRejects:$\
	AutoPolicy.UnderAPipelineEachRanksAnswerEqualsTheBruteForceOverItsPlacements:$\
	PipelineCli.SearchPipelineEqualsTheBruteForceOverItsSpace:$\
	Cli.AutoPolicyTrainsAsThePrintedPolicyGivenByHand:$\
	CliErrors.AnAllocationThatFailsIsOneLine

test-asan: setup $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD) -j $(JOBS) remat_tests
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(ASAN_BUILD)/remat_tests --gtest_brief=1 \
	  --gtest_filter='-$(RELEASE_ONLY)'

$(FUZZ_BUILD)/build.ninja:
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -G Ninja -DREMAT_FUZZ=ON

test-fuzz: setup $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD) -j $(JOBS)
	bash scripts/fuzz_smoke.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test:  # each part's wall time printed at the end
	@bash scripts/test.sh test-asan test-fast test-fuzz

bench: build
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/remat_bench

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
