// A worker's row-sparse push and pull (embedding tables): only the rows a
// step touched cross the wire, each to the server that holds it.
#include <cstring>

#include "ps/wire.h"
#include "ps/worker_impl.h"

namespace shoal::ps {
namespace {

// Copies rows `which` (indices into `src`'s first dimension) into a new
// tensor of shape [which.size(), src's other dimensions].
Tensor gather_rows(const Tensor& src, const std::vector<std::size_t>& which) {
  Shape shape = src.shape();
  shape[0] = static_cast<std::int64_t>(which.size());
  Tensor out = Tensor::empty(shape, src.dtype());
  const std::size_t row = src.dim(0) == 0 ? 0 : src.nbytes() / static_cast<std::size_t>(src.dim(0));
  for (std::size_t i = 0; i < which.size(); ++i)
    std::memcpy(static_cast<char*>(out.raw_data()) + i * row,
                static_cast<const char*>(src.raw_data()) + which[i] * row, row);
  return out;
}

// The entries of `rows` part `p` takes (into `mine`) and their indices on
// its server (into `local`): its own rows, slice-local; the first part also
// takes rows outside the key, so that its server names them.
void rows_of_part(std::int64_t begin, std::int64_t end, std::int64_t total,
                  const std::vector<std::int64_t>& rows, std::vector<std::size_t>* mine,
                  std::vector<std::int64_t>* local) {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const bool in = rows[i] >= begin && rows[i] < end;
    if (in || (begin == 0 && (rows[i] < 0 || rows[i] >= total))) {
      mine->push_back(i);
      local->push_back(in ? rows[i] - begin : rows[i]);
    }
  }
}

// What both row pushes start from, checked: the request (`op`: 'S' or
// 'R') without rows or values, and the key's shape.
Result<std::pair<Request, Shape>> row_request(const std::map<std::string, Shape>& shapes,
                                              const char* what, Op op, int worker,
                                              const Compression& c, const std::string& key,
                                              std::int64_t step, std::size_t rows,
                                              const Tensor& values, double lr) {
  auto shape = shapes.find(key);
  if (shape == shapes.end() || shape->second.empty())
    return failed_precondition("{} of key '{}': {}", what, key,
                               shape == shapes.end() ? "init it first" : "it is a scalar");
  if (values.rank() == 0 || values.dim(0) != static_cast<std::int64_t>(rows))
    return invalid_argument("{} of key '{}': {} row ids for values of shape {}", what, key, rows,
                            shape_str(values.shape()));
  Request r;
  r.op = op;
  r.worker = worker;
  r.key = key;
  r.step = step;
  r.lr = lr;
  r.codec = c.push == Codec::kTwoBit ? Codec::kF32 : c.push;  // rows never go two-bit
  r.reply = c.pull;
  return std::pair{std::move(r), shape->second};
}

}  // namespace

Result<PushResult> Worker::Impl::push_rows(const std::string& key, std::int64_t step,
                                           const std::vector<std::int64_t>& rows,
                                           const Tensor& values, double lr, Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(auto rs, row_request(shapes_, "push_rows", Op::kPushRows, worker_,
                                              compression_, key, step, rows.size(), values, lr));
  Request& r = rs.first;
  const Tensor v = values.contiguous();
  PushResult last = PushResult::kApplied;
  for (const Part& p : parts(key)) {
    std::vector<std::size_t> mine;
    r.rows.clear();
    rows_of_part(p.begin, p.end, rs.second[0], rows, &mine, &r.rows);
    r.value = gather_rows(v, mine);
    r.key = p.name;
    r.seq = ++seq_;
    SHOAL_ASSIGN_OR_RETURN(last, push_until_taken(p.server, r, dl));
  }
  return last;
}

Result<std::pair<std::uint64_t, Tensor>> Worker::Impl::pull_rows(
    const std::string& key, const std::vector<std::int64_t>& rows, std::uint64_t min_version,
    Deadline dl) {
  auto shape = shapes_.find(key);
  if (shape == shapes_.end() || shape->second.empty())
    return failed_precondition("pull_rows of key '{}': {}", key,
                               shape == shapes_.end() ? "init it first" : "it is a scalar");
  Shape out_shape = shape->second;
  out_shape[0] = static_cast<std::int64_t>(rows.size());
  Tensor out = Tensor::empty(out_shape, DType::kF32);
  const std::size_t row = out.numel() == 0 ? 0 : out.nbytes() / rows.size();
  std::uint64_t version = UINT64_MAX;
  for (const Part& p : parts(key)) {
    Request r;
    r.op = Op::kPullRows;
    r.key = p.name;
    r.min_version = min_version;
    r.reply = compression_.pull;
    std::vector<std::size_t> mine;
    rows_of_part(p.begin, p.end, shape->second[0], rows, &mine, &r.rows);
    if (mine.empty()) continue;
    SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(p.server, encode(r), dl));
    SHOAL_ASSIGN_OR_RETURN(auto got, decode_pull_reply(rep));
    if (got.second.rank() == 0 || got.second.dim(0) != static_cast<std::int64_t>(mine.size()) ||
        got.second.nbytes() != row * mine.size())
      return failed_precondition("pull_rows of key '{}': server {} sent {} for {} rows", key,
                                 p.server, shape_str(got.second.shape()), mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i)
      std::memcpy(static_cast<char*>(out.raw_data()) + mine[i] * row,
                  static_cast<const char*>(got.second.raw_data()) + i * row, row);
    version = std::min(version, got.first);
  }
  if (version == UINT64_MAX) version = 0;
  return std::pair{version, std::move(out)};
}

Result<Worker::Ticket> Worker::Impl::start_push_rows_pull(const std::string& key, std::int64_t step,
                                                          const std::vector<std::int64_t>& rows,
                                                          const Tensor& values, double lr,
                                                          Tensor into, Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(auto rs, row_request(shapes_, "push-rows-pull", Op::kPushRowsPull, worker_,
                                              compression_, key, step, rows.size(), values, lr));
  const Tensor v = values.contiguous();
  const std::int64_t total = rs.second[0];
  return launch(rs.first, parts(key), rs.second, into, dl, [&](Request& q, const Part& p) {
    std::vector<std::size_t> mine;
    rows_of_part(p.begin, p.end, total, rows, &mine, &q.rows);
    q.value = gather_rows(v, mine);
  });
}

}  // namespace shoal::ps
