// Collective checks shared by the native suite (threads on loopback) and
// the MPI suite (processes under mpirun): each runs on every rank and
// returns the first wrong element it finds, against a reference computed here.
#pragma once

#include <algorithm>
#include <cmath>

#include "shoal/comm/communicator.h"
#include "shoal/net/shared_memory.h"
#include "shoal/net/socket.h"
#include "shoal/net/store.h"
#include "shoal/tensor/tensor.h"

namespace shoal::comm::testing {

inline const DType kDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                DType::kI32, DType::kI64, DType::kU8};
inline const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                                ReduceOp::kAvg};

// Input of rank r, element i: small integers so every dtype holds the
// exact result; prod uses {1, 2} so 2^8 still fits f16.
inline double input(int r, std::size_t i, ReduceOp op) {
  if (op == ReduceOp::kProd) return static_cast<double>((r + i) % 2 + 1);
  return static_cast<double>((static_cast<std::size_t>(r) * 7 + i * 3) % 5 + 1);
}

inline double expected(int world, std::size_t i, ReduceOp op, DType dt) {
  double acc = input(0, i, op);
  for (int r = 1; r < world; ++r) {
    double v = input(r, i, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (dt == DType::kU8 && (op == ReduceOp::kProd || op == ReduceOp::kSum || op == ReduceOp::kAvg))
    acc = std::fmod(acc, 256.0);  // u8 arithmetic wraps
  if (op == ReduceOp::kAvg) {
    bool integral = dt == DType::kI32 || dt == DType::kI64 || dt == DType::kU8;
    acc = integral ? std::floor(acc / world) : acc / world;
  }
  return acc;
}

inline double tolerance(DType dt, ReduceOp op) {
  if (op != ReduceOp::kAvg) return 0;
  if (dt == DType::kF16 || dt == DType::kBF16) return 2e-2;
  return 1e-6;
}

inline Tensor make_input(int r, std::size_t n, DType dt, ReduceOp op) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(n)}, dt);
  for (std::size_t i = 0; i < n; ++i) t.set(static_cast<std::int64_t>(i), input(r, i, op));
  return t;
}

inline Status check_result(const Tensor& t, int world, ReduceOp op, DType dt,
                           const std::string& what) {
  double tol = tolerance(dt, op);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double want = expected(world, static_cast<std::size_t>(i), op, dt), got = t.get(i);
    if (std::abs(got - want) > tol * std::max(1.0, std::abs(want)))
      return internal_error("{}: element {} is {}, expected {}", what, i, got, want);
  }
  return ok_status();
}

inline Status check_allreduce_matrix(Communicator& c) {
  const int world = c.size();
  const std::size_t kCounts[] = {0, 1, 7, 13, 1031, (1 << 18) + 3};  // last: 1 MiB + odd (f32)
  for (std::size_t n : kCounts)
    for (DType dt : kDTypes)
      for (ReduceOp op : kOps) {
        if (n > 2000 && (op != ReduceOp::kSum || (dt != DType::kF32 && dt != DType::kBF16)))
          continue;  // the big count: ring path for f32 and the f32-accumulated bf16
        for (bool inplace : {true, false}) {
          Tensor in = make_input(c.rank(), n, dt, op);
          Tensor out = inplace ? in : Tensor::empty({static_cast<std::int64_t>(n)}, dt);
          SHOAL_RETURN_IF_ERROR(c.allreduce(in.raw_data(), out.raw_data(), n, dt, op));
          SHOAL_RETURN_IF_ERROR(check_result(
              out, world, op, dt,
              fmt::format("allreduce {} {} n={} {}", dtype_name(dt), reduce_op_name(op), n,
                          inplace ? "in place" : "out of place")));
        }
      }
  return ok_status();
}

inline Status check_rooted(Communicator& c) {
  const int w = c.size(), r = c.rank();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}})
    for (int root = 0; root < w; ++root) {
      // broadcast
      std::vector<std::int64_t> b(n);
      for (std::size_t i = 0; i < n; ++i)
        b[i] = r == root ? static_cast<std::int64_t>(i * 31 + root) : -1;
      SHOAL_RETURN_IF_ERROR(c.broadcast(b.data(), n, DType::kI64, root));
      for (std::size_t i = 0; i < n; ++i)
        if (b[i] != static_cast<std::int64_t>(i * 31 + root))
          return internal_error("broadcast root {} n {}: element {} = {}", root, n, i, b[i]);
      // reduce (f64 sum, and bf16 max through f32)
      std::vector<double> x(n), y(n, -1);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(r + i);
      SHOAL_RETURN_IF_ERROR(c.reduce(x.data(), y.data(), n, DType::kF64, ReduceOp::kSum, root));
      if (r == root)
        for (std::size_t i = 0; i < n; ++i)
          if (y[i] != static_cast<double>(w * (w - 1) / 2) + static_cast<double>(w * i))
            return internal_error("reduce root {} element {} = {}", root, i, y[i]);
      Tensor bx = make_input(r, n, DType::kBF16, ReduceOp::kMax);
      Tensor by = Tensor::empty({static_cast<std::int64_t>(n)}, DType::kBF16);
      SHOAL_RETURN_IF_ERROR(
          c.reduce(bx.raw_data(), by.raw_data(), n, DType::kBF16, ReduceOp::kMax, root));
      if (r == root)
        SHOAL_RETURN_IF_ERROR(check_result(by, w, ReduceOp::kMax, DType::kBF16, "reduce bf16 max"));
      // gather / scatter
      std::vector<std::int32_t> mine(n), all(n * static_cast<std::size_t>(w), -1), back(n, -1);
      for (std::size_t i = 0; i < n; ++i)
        mine[i] = static_cast<std::int32_t>(r * 1000 + static_cast<int>(i));
      SHOAL_RETURN_IF_ERROR(c.gather(mine.data(), all.data(), n, DType::kI32, root));
      if (r == root)
        for (int q = 0; q < w; ++q)
          for (std::size_t i = 0; i < n; ++i)
            if (all[static_cast<std::size_t>(q) * n + i] != q * 1000 + static_cast<int>(i))
              return internal_error("gather root {}: rank {} element {}", root, q, i);
      SHOAL_RETURN_IF_ERROR(c.scatter(all.data(), back.data(), n, DType::kI32, root));
      if (back != mine) return internal_error("scatter root {} n {}: wrong block", root, n);
    }
  return ok_status();
}

inline Status check_uneven(Communicator& c) {
  const int w = c.size(), r = c.rank();
  std::vector<std::size_t> counts;
  for (int q = 0; q < w; ++q)
    counts.push_back(static_cast<std::size_t>((q * 5 + 3) % 7));  // 3, 1, 6, 4, 2, 0, ...
  std::size_t total = 0;
  for (auto k : counts) total += k;
  // allgatherv
  std::vector<float> mine(counts[static_cast<std::size_t>(r)]), all(total, -1);
  for (std::size_t i = 0; i < mine.size(); ++i)
    mine[i] = static_cast<float>(r * 100 + static_cast<int>(i));
  SHOAL_RETURN_IF_ERROR(c.allgatherv(mine.data(), all.data(), counts, DType::kF32));
  std::size_t at = 0;
  for (int q = 0; q < w; ++q)
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i, ++at)
      if (all[at] != static_cast<float>(q * 100 + static_cast<int>(i)))
        return internal_error("allgatherv: rank {} element {}", q, i);
  // allgather, fixed count 13
  std::vector<std::int64_t> g(13), ga(13 * static_cast<std::size_t>(w));
  for (std::size_t i = 0; i < 13; ++i) g[i] = r * 13 + static_cast<std::int64_t>(i);
  SHOAL_RETURN_IF_ERROR(c.allgather(g.data(), ga.data(), 13, DType::kI64));
  for (std::size_t i = 0; i < ga.size(); ++i)
    if (ga[i] != static_cast<std::int64_t>(i)) return internal_error("allgather element {}", i);
  // reduce_scatter (sum over f64 and avg over f16)
  std::vector<double> in(total), out(counts[static_cast<std::size_t>(r)], -1);
  for (std::size_t i = 0; i < total; ++i)
    in[i] = static_cast<double>(r + 1) * static_cast<double>(i);
  SHOAL_RETURN_IF_ERROR(
      c.reduce_scatter(in.data(), out.data(), counts, DType::kF64, ReduceOp::kSum));
  std::size_t off = 0;
  for (int q = 0; q < r; ++q) off += counts[static_cast<std::size_t>(q)];
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != static_cast<double>(w * (w + 1) / 2) * static_cast<double>(off + i))
      return internal_error("reduce_scatter element {} = {}", i, out[i]);
  Tensor hin = make_input(r, total, DType::kF16, ReduceOp::kAvg);
  Tensor hout =
      Tensor::empty({static_cast<std::int64_t>(counts[static_cast<std::size_t>(r)])}, DType::kF16);
  SHOAL_RETURN_IF_ERROR(
      c.reduce_scatter(hin.raw_data(), hout.raw_data(), counts, DType::kF16, ReduceOp::kAvg));
  for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i) {
    double want = expected(w, off + i, ReduceOp::kAvg, DType::kF16);
    if (std::abs(hout.get(static_cast<std::int64_t>(i)) - want) > 2e-2 * want)
      return internal_error("reduce_scatter f16 avg element {}", i);
  }
  // all_to_allv: rank r sends (r + q) % 4 values to rank q.
  std::vector<std::size_t> sc, rc;
  for (int q = 0; q < w; ++q) {
    sc.push_back(static_cast<std::size_t>((r + q) % 4));
    rc.push_back(static_cast<std::size_t>((q + r) % 4));
  }
  std::vector<std::int32_t> sbuf, rbuf;
  for (int q = 0; q < w; ++q)
    for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i)
      sbuf.push_back(r * 10000 + q * 100 + static_cast<int>(i));
  std::size_t rtotal = 0;
  for (auto k : rc) rtotal += k;
  rbuf.assign(rtotal, -1);
  SHOAL_RETURN_IF_ERROR(c.all_to_allv(sbuf.data(), sc, rbuf.data(), rc, DType::kI32));
  at = 0;
  for (int q = 0; q < w; ++q)
    for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i, ++at)
      if (rbuf[at] != q * 10000 + r * 100 + static_cast<int>(i))
        return internal_error("all_to_allv from rank {} element {}", q, i);
  SHOAL_RETURN_IF_ERROR(c.barrier());
  // send/recv around a ring
  if (w > 1) {
    std::vector<std::uint8_t> msg(77, static_cast<std::uint8_t>(r)), got(77);
    int to = (r + 1) % w, from = (r - 1 + w) % w;
    if (r % 2 == 0) {
      SHOAL_RETURN_IF_ERROR(c.send(msg.data(), 77, DType::kU8, to, 5));
      SHOAL_RETURN_IF_ERROR(c.recv(got.data(), 77, DType::kU8, from, 5));
    } else {
      SHOAL_RETURN_IF_ERROR(c.recv(got.data(), 77, DType::kU8, from, 5));
      SHOAL_RETURN_IF_ERROR(c.send(msg.data(), 77, DType::kU8, to, 5));
    }
    if (got[0] != from) return internal_error("recv got {} from {}", got[0], from);
  }
  return ok_status();
}

inline Status check_async_split(Communicator& c) {
  std::vector<float> a(1000, 1.f), b(7, 2.f);
  WorkPtr w1 = c.allreduce_async(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum);
  WorkPtr w2 = c.allreduce_async(b.data(), b.data(), b.size(), DType::kF32, ReduceOp::kMax);
  std::int64_t root_val = c.rank() == 1 ? 42 : -1;
  std::vector<std::int32_t> gathered(static_cast<std::size_t>(c.size()));
  std::int32_t me32 = c.rank();
  WorkPtr w3 = c.broadcast_async(&root_val, 1, DType::kI64, 1 % c.size());
  WorkPtr w4 = c.allgather_async(&me32, gathered.data(), 1, DType::kI32);
  WorkPtr w5 = c.barrier_async();
  SHOAL_RETURN_IF_ERROR(w5->wait(c.deadline()));
  SHOAL_RETURN_IF_ERROR(w4->wait(c.deadline()));
  SHOAL_RETURN_IF_ERROR(w3->wait(c.deadline()));
  if (c.size() > 1 && root_val != 42) return internal_error("broadcast_async got {}", root_val);
  for (int q = 0; q < c.size(); ++q)
    if (gathered[static_cast<std::size_t>(q)] != q)
      return internal_error("allgather_async slot {}", q);
  SHOAL_RETURN_IF_ERROR(w2->wait(c.deadline()));
  SHOAL_RETURN_IF_ERROR(w1->wait(c.deadline()));
  if (!w1->test() || a[999] != 5.f || b[0] != 2.f) return internal_error("async results");
  // Even and odd ranks, ordered by descending rank.
  SHOAL_ASSIGN_OR_RETURN(auto sub, c.split(c.rank() % 2, -c.rank()));
  int want_size = c.rank() % 2 == 0 ? 3 : 2;
  if (sub->size() != want_size) return internal_error("split size {}", sub->size());
  std::int32_t v = c.rank(), s = 0;
  SHOAL_RETURN_IF_ERROR(sub->allreduce(&v, &s, 1, DType::kI32, ReduceOp::kSum));
  if (s != (c.rank() % 2 == 0 ? 0 + 2 + 4 : 1 + 3)) return internal_error("split sum {}", s);
  std::int32_t first = sub->rank() == 0 ? c.rank() : -1;
  SHOAL_RETURN_IF_ERROR(sub->broadcast(&first, 1, DType::kI32, 0));
  if (first != (c.rank() % 2 == 0 ? 4 : 3)) return internal_error("split order: root is {}", first);
  return ok_status();
}

}  // namespace shoal::comm::testing
