# Entry points named by the README. Each installs what it needs, then builds.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps build run test asan tsan fuzz bench clean format

deps:
	bash tools/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/shoal run -n 2 -- ./$(BUILD)/shoal train --model cnn --data fashion-mnist --epochs 1

test: build
	bash tools/run-tests.sh $(BUILD) $(JOBS)

asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=ON -DSHOAL_NATIVE=OFF
	cmake --build build-asan -j $(JOBS) --target unit_tests
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) --timeout 900 -L "unit|sanitize"

# ThreadSanitizer over the tests of the threaded modules (comm, net, the
# prefetching loader). OpenMP kernels are left out: libgomp is not
# instrumented, so TSan cannot see its barriers.
tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_TSAN=ON -DSHOAL_NATIVE=OFF
	cmake --build build-tsan -j $(JOBS) --target communicator_test comm_faults_test store_test data_test server_test frame_server_test push_pipeline_test ps_in_place_test http_server_test
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --output-on-failure -j $(JOBS) --timeout 900 -R "^(Comm/Transports|Allreduce|Collectives|Faults|Frames|Env|Store|FileStore|Loader|Shm|PsServer|FrameServer|PsPipeline|PsInPlace|HttpServer)\\."

# libFuzzer over the network parsers (frames, store requests, handshake),
# FUZZ_SECONDS long (default 60).
fuzz: deps
	bash tools/fuzz.sh

bench: build
	bash tools/install-deps.sh
	./$(BUILD)/bench_ops 2 10
	/usr/bin/python3 bench/train.py
	/usr/bin/python3 bench/comm.py -n 2

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
