// Collectives against references computed here, over real TCP on
// loopback: world sizes 1, 2, 3, 4, 5, 8 (one thread per rank, each with
// its own Communicator and sockets), counts 0, 1, 7, a prime, uneven
// splits and 1 MiB + odd, every dtype and reduce op, in place and not.
// The faults are comm_faults_test.cc's.
#include "shoal/comm/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "comm/checks.h"
#include "comm/world.h"
#include "shoal/net/shared_memory.h"
#include "shoal/tensor/tensor.h"

namespace shoal::comm {
namespace {
using namespace shoal::comm::testing;

class Transports : public ::testing::TestWithParam<const char*> {
 protected:
  CommOptions opts() const {
    CommOptions o;
    o.transport = GetParam();
    o.shm_bytes = 64 << 10;  // small rings: messages wrap around many times
    return o;
  }
};
INSTANTIATE_TEST_SUITE_P(Comm, Transports, ::testing::Values("auto", "tcp"), [](const auto& info) {
  return std::string(info.param) == "auto" ? "shm" : "tcp";
});

TEST_P(Transports, AllreduceEveryDtypeOpCountWorldAndPlacement) {
  for (int world : {1, 2, 3, 4, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto st = run_world(
        world, [&](Communicator& c) -> Status { return check_allreduce_matrix(c); }, opts());
    expect_all_ok(st);
  }
}

// Direct reads of peers' buffers (process_vm_readv) on every dtype, op,
// count and placement; all ranks get the same bits.
TEST(Allreduce, DirectOnEveryInput) {
  for (int world : {2, 3, 4, 5}) {
    SCOPED_TRACE("world " + std::to_string(world));
    CommOptions o;
    o.allreduce = Algorithm::kDirect;
    std::vector<std::vector<float>> got(static_cast<std::size_t>(world));
    auto st = run_world(
        world,
        [&](Communicator& c) -> Status {
          SHOAL_RETURN_IF_ERROR(check_allreduce_matrix(c));
          std::vector<float> v(100003);
          for (std::size_t i = 0; i < v.size(); ++i)
            v[i] = 1.0f / static_cast<float>(1 + i + static_cast<std::size_t>(c.rank()) * 7);
          SHOAL_RETURN_IF_ERROR(
              c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum));
          if (std::string(c.last_algorithm()) != "direct")
            return internal_error("used {}, not direct (is process_vm_readv allowed here?)",
                                  c.last_algorithm());
          got[static_cast<std::size_t>(c.rank())] = v;
          return ok_status();
        },
        o);
    expect_all_ok(st);
    for (int r = 1; r < world; ++r)
      EXPECT_EQ(got[static_cast<std::size_t>(r)], got[0]) << "rank " << r;
  }
}

// The direct all-reduce over buffers in shared regions (what a
// data-parallel arena is): each rank maps its peers' regions and reduces
// through the mappings. Every dtype and op at uneven counts, at a nonzero
// offset in the region; bit-identical to the same call copied through
// process_vm_readv (same reduction order); and a world where only the even
// ranks' buffers are shared, so some peers are mapped and others copied.
TEST(Allreduce, DirectOverSharedBuffers) {
  const std::size_t kCounts[] = {1, 7, 13, 1031, 100003};
  for (int world : {2, 3, 4, 5}) {
    for (int mode : {0, 1}) {  // 0: every rank shared, 1: even ranks only
      SCOPED_TRACE(fmt::format("world {} {}", world, mode ? "even ranks shared" : "all shared"));
      CommOptions o;
      o.allreduce = Algorithm::kDirect;
      std::vector<std::vector<float>> mapped(static_cast<std::size_t>(world)),
          copied(static_cast<std::size_t>(world));
      auto st = run_world(
          world,
          [&](Communicator& c) -> Status {
            const bool shared = mode == 0 || c.rank() % 2 == 0;
            // This rank maps every peer when every other rank is shared.
            bool all_peers_shared = true;
            for (int q = 0; q < c.size(); ++q)
              all_peers_shared = all_peers_shared && (q == c.rank() || mode == 0 || q % 2 == 0);
            for (std::size_t n : kCounts)
              for (DType dt : {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kU8})
                for (ReduceOp op : kOps) {
                  const std::size_t bytes = n * dtype_size(dt) + 64;
                  SHOAL_ASSIGN_OR_RETURN(auto region, Communicator::allocate_shared(bytes));
                  auto storage = shared ? Storage::wrap(region->data(), bytes, region)
                                        : Storage::allocate(bytes);
                  // 64 bytes in: the buffer does not start the region.
                  Tensor t = Tensor::from_storage(storage, {static_cast<std::int64_t>(n)}, dt,
                                                  static_cast<std::int64_t>(64 / dtype_size(dt)));
                  SHOAL_RETURN_IF_ERROR(t.copy_from(make_input(c.rank(), n, dt, op)));
                  SHOAL_RETURN_IF_ERROR(c.allreduce(t.raw_data(), t.raw_data(), n, dt, op));
                  const std::string what =
                      fmt::format("{} {} n={}", dtype_name(dt), reduce_op_name(op), n);
                  if (std::string(c.last_algorithm()) != "direct")
                    return internal_error("{}: used {}", what, c.last_algorithm());
                  if (c.last_direct_mapped() != all_peers_shared)
                    return internal_error("{}: last_direct_mapped() is {}", what,
                                          c.last_direct_mapped());
                  SHOAL_RETURN_IF_ERROR(check_result(t, c.size(), op, dt, what));
                }
            // The same f32 average through mappings and through CMA.
            std::vector<float> v(100003);
            for (std::size_t i = 0; i < v.size(); ++i)
              v[i] = 1.0f / static_cast<float>(3 + i + static_cast<std::size_t>(c.rank()) * 11);
            SHOAL_ASSIGN_OR_RETURN(auto region, Communicator::allocate_shared(v.size() * 4));
            auto* buf = static_cast<float*>(region->data());
            std::copy(v.begin(), v.end(), buf);
            SHOAL_RETURN_IF_ERROR(c.allreduce(buf, buf, v.size(), DType::kF32, ReduceOp::kAvg));
            mapped[static_cast<std::size_t>(c.rank())].assign(buf, buf + v.size());
            SHOAL_RETURN_IF_ERROR(
                c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kAvg));
            if (c.last_direct_mapped()) return internal_error("private buffers were mapped");
            copied[static_cast<std::size_t>(c.rank())] = v;
            return ok_status();
          },
          o);
      expect_all_ok(st);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(mapped[static_cast<std::size_t>(r)], copied[0]) << "rank " << r;
        EXPECT_EQ(copied[static_cast<std::size_t>(r)], copied[0]) << "rank " << r;
      }
    }
  }
}

// Recursive halving-doubling (Rabenseifner) on every input, powers of two
// and not.
TEST(Allreduce, HalvingDoublingOnEveryInput) {
  for (int world : {2, 3, 4, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    CommOptions o;
    o.allreduce = Algorithm::kHalvingDoubling;
    auto st = run_world(
        world,
        [&](Communicator& c) -> Status {
          SHOAL_RETURN_IF_ERROR(check_allreduce_matrix(c));
          if (std::string(c.last_algorithm()) != "halving-doubling")
            return internal_error("used {}", c.last_algorithm());
          return ok_status();
        },
        o);
    expect_all_ok(st);
  }
}

// f16 and bf16 travel as themselves: half the bytes of f32 on every
// algorithm that sends them (before, the whole buffer was widened to f32
// first, so `--wire bf16` sent f32's bytes).
TEST(Allreduce, HalfTypesTravelAsHalfTheBytes) {
  for (Algorithm a :
       {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kHalvingDoubling}) {
    CommOptions o;
    o.allreduce = a;
    auto st = run_world(
        3,
        [&](Communicator& c) -> Status {
          const std::size_t n = 30001;
          std::vector<std::uint64_t> sent;
          for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
            Tensor t = make_input(c.rank(), n, dt, ReduceOp::kSum);
            const std::uint64_t before = c.bytes_sent();
            SHOAL_RETURN_IF_ERROR(c.allreduce(t.raw_data(), t.raw_data(), n, dt, ReduceOp::kSum));
            sent.push_back(c.bytes_sent() - before);
            SHOAL_RETURN_IF_ERROR(check_result(t, c.size(), ReduceOp::kSum, dt, dtype_name(dt)));
          }
          if (sent[0] == 0 || 2 * sent[1] > sent[0] + 64 || 2 * sent[2] > sent[0] + 64)
            return internal_error("{}: bytes sent f32 {}, bf16 {}, f16 {}", c.last_algorithm(),
                                  sent[0], sent[1], sent[2]);
          // Reduce-scatter and reduce (ring, binomial) likewise.
          const std::vector<std::size_t> counts = {10000, 10001, 10000};
          std::vector<std::uint64_t> rs, red;
          for (DType dt : {DType::kF32, DType::kBF16}) {
            Tensor in = make_input(c.rank(), n, dt, ReduceOp::kSum);
            Tensor out = Tensor::empty(
                {static_cast<std::int64_t>(counts[static_cast<std::size_t>(c.rank())])}, dt);
            std::uint64_t before = c.bytes_sent();
            SHOAL_RETURN_IF_ERROR(
                c.reduce_scatter(in.raw_data(), out.raw_data(), counts, dt, ReduceOp::kSum));
            rs.push_back(c.bytes_sent() - before);
            before = c.bytes_sent();
            SHOAL_RETURN_IF_ERROR(c.reduce(in.raw_data(), in.raw_data(), n, dt, ReduceOp::kSum, 0));
            red.push_back(c.bytes_sent() - before);
          }
          if (2 * rs[1] > rs[0] + 64 || 2 * red[1] > red[0] + 64)
            return internal_error("bytes sent f32/bf16: reduce-scatter {}/{}, reduce {}/{}", rs[0],
                                  rs[1], red[0], red[1]);
          return ok_status();
        },
        o);
    expect_all_ok(st);
  }
}

// Two levels: ranks told they sit on different hosts (SHOAL_HOST_ID). Hosts
// with as many ranks each (2 + 2, 2 + 2 + 2 interleaved, 3 + 3 + 3) slice:
// reduce-scatter within the host, all-reduce each slice across the hosts,
// all-gather; uneven hosts (3 + 2, 2 + 1 + 2 + 1 + 2) reduce to a leader,
// all-reduce among the leaders and broadcast back.
TEST(Allreduce, HierarchicalAcrossHosts) {
  struct Layout {
    int world;
    std::vector<int> host;  // host of each rank
  };
  for (const Layout& l : {Layout{4, {0, 0, 1, 1}}, Layout{6, {0, 1, 2, 0, 1, 2}},
                          Layout{9, {0, 0, 0, 1, 1, 1, 2, 2, 2}}, Layout{5, {0, 1, 0, 1, 0}},
                          Layout{8, {0, 0, 1, 2, 2, 3, 4, 4}}}) {
    SCOPED_TRACE("world " + std::to_string(l.world));
    CommOptions o;
    o.allreduce = Algorithm::kHierarchical;
    o.hier_piece_bytes = 1000;  // many pieces, the last one short: the pipeline
    std::vector<std::string> algos(static_cast<std::size_t>(l.world));
    auto st = run_world(
        l.world,
        [&](Communicator& c) -> Status {
          SHOAL_RETURN_IF_ERROR(check_allreduce_matrix(c));
          algos[static_cast<std::size_t>(c.rank())] = c.last_algorithm();
          const int mine = l.host[static_cast<std::size_t>(c.rank())];
          const int want = static_cast<int>(std::count(l.host.begin(), l.host.end(), mine));
          if (c.local_size() != want)
            return internal_error("local_size() is {}, {} ranks are on host{}", c.local_size(),
                                  want, mine);
          return ok_status();
        },
        o,
        [&](int r, CommOptions& ro) {
          ro.host_id = "host" + std::to_string(l.host[static_cast<std::size_t>(r)]);
        });
    expect_all_ok(st);
    for (const auto& a : algos) EXPECT_EQ(a, "hierarchical");
  }
}

TEST(Allreduce, RingAndRecursiveDoublingAgreeBitwise) {
  for (int world : {3, 4, 5}) {
    for (const char* algo : {"ring", "rd"}) {
      CommOptions o;
      o.allreduce = *parse_algorithm(algo);
      std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
      auto st = run_world(
          world,
          [&](Communicator& c) -> Status {
            std::vector<float> v(1001);
            for (std::size_t i = 0; i < v.size(); ++i)
              v[i] = 1.0f / static_cast<float>(1 + i + static_cast<std::size_t>(c.rank()) * 13);
            SHOAL_RETURN_IF_ERROR(
                c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum));
            results[static_cast<std::size_t>(c.rank())] = v;
            return ok_status();
          },
          o);
      expect_all_ok(st);
      // Every rank ends with the same bits, whatever the algorithm.
      for (int r = 1; r < world; ++r)
        EXPECT_EQ(results[0], results[static_cast<std::size_t>(r)]) << algo << " world " << world;
    }
  }
}

TEST(Collectives, RootedCallsAtEveryRoot) {
  for (int world : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto st = run_world(world, [&](Communicator& c) -> Status { return check_rooted(c); });
    expect_all_ok(st);
  }
}

TEST_P(Transports, AllgatherReduceScatterAllToAllUneven) {
  for (int world : {1, 2, 3, 4, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto st = run_world(
        world, [&](Communicator& c) -> Status { return check_uneven(c); }, opts());
    expect_all_ok(st);
  }
}

// The ring reduce-scatter (the path ZeRO's flat gradient takes on 2 ranks,
// and wherever ranks cannot reach each other's memory), in place and apart,
// over sizes that grow and shrink (its blocks are kept between calls and
// the last one lands in the output directly), none divided evenly, at 1-5
// ranks. Sums of small integers: exact in f32.
Status check_ring_reduce_scatter(Communicator& c) {
  const int w = c.size(), r = c.rank();
  const float sum = static_cast<float>(w * (w + 1) / 2);
  for (std::size_t base : {std::size_t{300007}, std::size_t{5}, std::size_t{1200011},
                           std::size_t{0}, std::size_t{65537}}) {
    std::vector<std::size_t> counts, off{0};
    for (int q = 0; q < w; ++q) {
      counts.push_back(base + static_cast<std::size_t>(q * 3 % 7));
      off.push_back(off.back() + counts.back());
    }
    const std::size_t total = off.back(), mine = counts[static_cast<std::size_t>(r)];
    const std::size_t at = off[static_cast<std::size_t>(r)];
    for (bool in_place : {false, true}) {
      std::vector<float> in(total), apart(mine, -1.f);
      for (std::size_t i = 0; i < total; ++i)
        in[i] = static_cast<float>((r + 1) * static_cast<int>(i % 1000));
      float* out = in_place ? in.data() + at : apart.data();
      SHOAL_RETURN_IF_ERROR(c.reduce_scatter(in.data(), out, counts, DType::kF32, ReduceOp::kSum));
      if (c.last_direct_mapped()) return internal_error("reduce_scatter went direct, not by ring");
      for (std::size_t i = 0; i < mine; ++i)
        if (out[i] != sum * static_cast<float>((at + i) % 1000))
          return internal_error("reduce_scatter ({}, {} a rank) element {} = {}",
                                in_place ? "in place" : "apart", base, at + i, out[i]);
    }
  }
  return ok_status();
}

TEST(Collectives, RingReduceScatterInPlaceApartAndAcrossSizes) {
  CommOptions o;
  o.allreduce = Algorithm::kRing;  // no direct path for reduce-scatter either
  for (int world : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_all_ok(run_world(world, check_ring_reduce_scatter, o));
  }
}

// Reduce-scatter and all-gather by the direct algorithm (forced: every size
// goes direct): through cross-memory attach with private buffers (the
// uneven checks: empty parts, f64 sums, f16 averages, i64), and through
// mappings with buffers in shared regions, in place and apart, at sizes
// none divides, at 2-5 ranks.
Status check_direct_shared(Communicator& c) {
  const int w = c.size(), r = c.rank();
  const std::size_t kParts[] = {100003, 7, 65537, 0, 31};
  std::vector<std::size_t> counts(kParts, kParts + w), off(static_cast<std::size_t>(w) + 1, 0);
  for (int q = 0; q < w; ++q)
    off[static_cast<std::size_t>(q) + 1] =
        off[static_cast<std::size_t>(q)] + counts[static_cast<std::size_t>(q)];
  const std::size_t total = off.back(), mine = counts[static_cast<std::size_t>(r)];
  const std::size_t at = off[static_cast<std::size_t>(r)];
  std::vector<std::shared_ptr<net::SharedRegion>> keep;  // alive to the end
  auto region = [&keep](std::size_t floats) -> Result<float*> {
    SHOAL_ASSIGN_OR_RETURN(auto reg, Communicator::allocate_shared(4 * floats + 64));
    keep.push_back(reg);
    return reinterpret_cast<float*>(static_cast<std::uint8_t*>(reg->data()) + 64);
  };
  const float sum = static_cast<float>(w * (w + 1) / 2);
  for (bool in_place : {false, true}) {
    // reduce-scatter: rank q sends (q + 1) * (i % 1000); the sum is exact
    SHOAL_ASSIGN_OR_RETURN(float* in, region(total));
    for (std::size_t i = 0; i < total; ++i)
      in[i] = static_cast<float>((r + 1) * static_cast<int>(i % 1000));
    SHOAL_ASSIGN_OR_RETURN(float* apart, region(mine));
    float* out = in_place ? in + at : apart;
    SHOAL_RETURN_IF_ERROR(c.reduce_scatter(in, out, counts, DType::kF32, ReduceOp::kSum));
    if (!c.last_direct_mapped()) return internal_error("reduce_scatter: peers not mapped");
    for (std::size_t i = 0; i < mine; ++i)
      if (out[i] != sum * static_cast<float>((at + i) % 1000))
        return internal_error("reduce_scatter ({}) element {} = {}",
                              in_place ? "in place" : "apart", at + i, out[i]);
    // all-gather: rank q's part is q * 1000 + i % 1000
    SHOAL_ASSIGN_OR_RETURN(float* all, region(total));
    std::fill(all, all + total, -1.f);
    float* part = in_place ? all + at : apart;
    for (std::size_t i = 0; i < mine; ++i) part[i] = static_cast<float>(r * 1000 + (i % 1000));
    SHOAL_RETURN_IF_ERROR(c.allgatherv(part, all, counts, DType::kF32));
    if (!c.last_direct_mapped()) return internal_error("allgather: peers not mapped");
    for (int q = 0; q < w; ++q)
      for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
        if (all[off[static_cast<std::size_t>(q)] + i] != static_cast<float>(q * 1000 + (i % 1000)))
          return internal_error("allgather ({}): rank {} element {}",
                                in_place ? "in place" : "apart", q, i);
  }
  return ok_status();
}

TEST(Collectives, DirectReduceScatterAndAllgather) {
  CommOptions o;
  o.allreduce = Algorithm::kDirect;
  for (int world : {2, 3, 4, 5}) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_all_ok(run_world(
        world, [](Communicator& c) { return check_uneven(c); }, o));
    expect_all_ok(run_world(world, check_direct_shared, o));
  }
}

TEST(Collectives, AsyncWorkAndSplit) {
  auto st = run_world(5, [&](Communicator& c) -> Status { return check_async_split(c); });
  expect_all_ok(st);
}

// The α-β tuner: calibrated at start-up, agreed on by every rank (so all
// pick the same algorithm); off under SHOAL_DETERMINISTIC semantics.
TEST(Tuner, CalibratedModelIsTheSameOnEveryRank) {
  auto st = run_world(3, [](Communicator& c) -> Status {
    if (!(c.alpha() > 0 && c.beta() > 0))
      return internal_error("alpha {} beta {}", c.alpha(), c.beta());
    double mine[2] = {c.alpha(), c.beta()}, all[6];
    SHOAL_RETURN_IF_ERROR(c.allgather(mine, all, 2, DType::kF64));
    for (int r = 0; r < 3; ++r)
      if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
        return internal_error("rank {} has a different model", r);
    // Every rank reports the same choice for the same size.
    std::vector<float> v(300000, 1.f);
    SHOAL_RETURN_IF_ERROR(c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum));
    std::int32_t ring = std::string(c.last_algorithm()) == "ring", any = ring;
    SHOAL_RETURN_IF_ERROR(c.allreduce(&any, &any, 1, DType::kI32, ReduceOp::kSum));
    if (any != 0 && any != 3) return internal_error("ranks chose different algorithms");
    return ok_status();
  });
  expect_all_ok(st);
  CommOptions det;
  det.deterministic = true;
  auto st2 = run_world(
      2,
      [](Communicator& c) -> Status {
        return c.alpha() == 0 ? ok_status() : internal_error("deterministic run calibrated");
      },
      det);
  expect_all_ok(st2);
}

}  // namespace
}  // namespace shoal::comm
