# Entry points named by the README. Each installs what it needs, then builds.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps build run test asan bench clean format

deps:
	bash tools/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/shoal train --model cnn --data fashion-mnist --epochs 1

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=ON -DSHOAL_NATIVE=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) --timeout 900 -LE accuracy

bench: build
	SHOAL_WITH_PEERS=1 bash tools/install-deps.sh
	./$(BUILD)/bench_ops 2 10
	/usr/bin/python3 bench/train.py
	/usr/bin/python3 bench/comm.py -n 2

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD) build-asan
