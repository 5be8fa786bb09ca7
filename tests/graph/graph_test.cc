// Bad graphs yield errors that name the node and the shapes; passes keep
// graphs valid.
#include <gtest/gtest.h>

#include "shoal/graph/builder.h"
#include "shoal/graph/passes.h"

namespace shoal::graph {
namespace {

void expect_msg(const Status& st, std::initializer_list<const char*> needles) {
  ASSERT_FALSE(st.ok());
  for (const char* n : needles)
    EXPECT_NE(st.message().find(n), std::string::npos) << st.message() << " lacks " << n;
}

TEST(Graph, ShapeMismatchNamesNodeAndShapes) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {4, 3});
  Value w = b.input("w", DType::kF32, {5, 7});
  b.op("linear", {x, w}, {}, "fc1");
  expect_msg(b.status(), {"'fc1'", "linear", "f32[4, 3]", "f32[5, 7]"});
  // Later ops are skipped, the first error is kept.
  b.relu(Value{});
  expect_msg(b.status(), {"'fc1'"});
}

TEST(Graph, DTypeMismatchAndUnknowns) {
  Graph g;
  Value a = g.input("a", {DType::kF32, {2}});
  Value c = g.input("c", {DType::kF64, {2}});
  expect_msg(g.add("add", {a, c}).status(), {"add", "f32[2]", "f64[2]"});
  expect_msg(g.add("frobnicate", {a}).status(), {"unknown op 'frobnicate'"});
  expect_msg(g.add("relu", {a}, {{"alpha", 0.1}}).status(), {"unknown attribute 'alpha'"});
  expect_msg(g.add("relu", {a, a}).status(), {"relu", "inputs"});
  expect_msg(g.add("relu", {Value{99, 0}}).status(), {"missing node 99"});
  expect_msg(g.add("conv2d", {a, a}).status(), {"conv2d", "NCHW"});
  expect_msg(g.add("reshape", {a}, {{"shape", Shape{3}}}).status(), {"cannot be viewed as [3]"});
  expect_msg(g.add("cast", {a}, {{"dtype", std::string("f7")}}).status(), {"'f7'"});
}

TEST(Graph, VerifyFindsCycleAndStaleTypes) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {3});
  Value y = b.relu(x);
  Value z = b.exp(y);
  g.mark_output(z);
  ASSERT_TRUE(verify(g).ok());
  g.mutable_node(y.node).inputs[0] = z;  // relu now reads its own consumer
  expect_msg(verify(g), {"cycle"});
  g.mutable_node(y.node).inputs[0] = x;
  g.mutable_node(z.node).outputs[0].shape = {4};
  expect_msg(verify(g), {"exp", "f32[4]", "f32[3]"});
}

TEST(Graph, DeadCodeEliminationKeepsWhatOutputsNeed) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {3});
  Value used = b.relu(x);
  b.exp(x);  // unused
  g.mark_output(used);
  EXPECT_EQ(eliminate_dead_code(g), 1);
  ASSERT_TRUE(verify(g).ok());
  auto order = g.topo_order();
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(order->size(), 2u);
}

// transpose(relu(transpose(x, p)), q) is relu(x) when q undoes p; a
// transpose that does not undo the first, or a softmax (it reads a whole
// row) between them, is left alone.
TEST(Graph, TransposesThatUndoEachOtherAcrossAPointwiseOpCancel) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 3, 4});
  Value t = b.transpose(x, {1, 2, 0});                   // [3, 4, 2]
  Value back = b.transpose(b.relu(t), {2, 0, 1});        // undoes it: [2, 3, 4]
  Value other = b.transpose(b.tanh(t), {1, 0, 2});       // does not: [4, 3, 2]
  Value row = b.transpose(b.softmax(t, -1), {2, 0, 1});  // softmax is not pointwise
  Value y = b.exp(back);
  g.mark_output(y);
  g.mark_output(other);
  g.mark_output(row);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto done = cancel_shape_pairs(g);
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  EXPECT_EQ(*done, 1);
  const Node& relu = g.node(g.node(y.node).inputs[0].node);
  EXPECT_EQ(relu.op, "relu");
  EXPECT_EQ(relu.inputs[0], x);
  EXPECT_EQ(g.type(relu.inputs[0]).shape, (Shape{2, 3, 4}));
  EXPECT_EQ(eliminate_dead_code(g), 2);  // the old relu and the transpose after it
  ASSERT_TRUE(verify(g).ok());
}

// A 1-D net's activations between its 4-D ops: [N, C, 1, L] -> [N, C, L],
// a pointwise op, and back; or back with nothing between.
TEST(Graph, ReshapesThatUndoEachOtherCancel) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 3, 1, 4});
  Value back = b.reshape(b.relu(b.reshape(x, {2, 3, 4})), {2, 3, 1, 4});
  Value direct = b.reshape(b.reshape(x, {6, 4}), {2, 3, 1, 4});
  Value other = b.reshape(b.tanh(b.reshape(x, {2, 3, 4})), {3, 2, 4});  // not x's shape
  Value y = b.exp(back);
  Value z = b.neg(direct);
  g.mark_output(y);
  g.mark_output(z);
  g.mark_output(other);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto done = cancel_shape_pairs(g);
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  EXPECT_EQ(*done, 2);
  const Node& relu = g.node(g.node(y.node).inputs[0].node);
  EXPECT_EQ(relu.op, "relu");
  EXPECT_EQ(relu.inputs[0], x);
  EXPECT_EQ(g.node(z.node).inputs[0], x);
  EXPECT_EQ(g.node(g.node(other.node).inputs[0].node).op, "tanh");
  EXPECT_EQ(eliminate_dead_code(g), 5);  // the old relu, its reshapes, the direct pair
  ASSERT_TRUE(verify(g).ok());
}

TEST(Graph, MemoryPlanReusesBuffersOfDeadValues) {
  Graph g;
  Builder b(g);
  Value v = b.input("x", DType::kF32, {1024});
  for (int i = 0; i < 10; ++i) v = b.relu(v);  // a chain: at most two live at once
  g.mark_output(v);
  auto order = g.topo_order();
  MemoryPlan p = plan_memory(g, *order);
  EXPECT_EQ(p.naive_bytes, 10u * 4096);
  EXPECT_EQ(p.arena_bytes, 2u * 4096);
  // Live ranges that overlap never share bytes.
  for (int i = 2; i < g.num_nodes(); ++i) {
    Value a{i - 1, 0}, c{i, 0};
    if (p.offset.count(a) && p.offset.count(c)) {
      EXPECT_NE(p.offset[a], p.offset[c]);
    }
  }
}

TEST(Graph, MemoryPlanPacksValuesBackToBack) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {7});
  Value a = b.relu(x);        // 7 floats: 28 bytes, not a multiple of the alignment
  Value t = b.exp(x);         // lives while the pack does: must not overlap it
  Value c = b.neg(b.neg(x));  // 7 floats, defined later than a
  Value s = b.add(a, c);      // the pack's "in-place" reader
  Value u = b.add(s, t);
  g.mark_output(u);
  auto order = g.topo_order();
  ASSERT_TRUE(order.ok());
  Pack pk;
  pk.members = {a, c};
  pk.aliases = {s};  // s sits over a
  MemoryPlan p = plan_memory(g, *order, {}, 64, {pk});
  EXPECT_EQ(p.offset.at(c), p.offset.at(a) + 28);  // no padding between members
  EXPECT_EQ(p.offset.at(s), p.offset.at(a));
  // t is alive from before c to u: it overlaps neither member.
  const std::size_t t0 = p.offset.at(t), pk0 = p.offset.at(a);
  EXPECT_TRUE(t0 + 28 <= pk0 || pk0 + 56 <= t0) << t0 << " vs pack at " << pk0;
}

TEST(Graph, Dumps) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {2, 3});
  Value y = b.op("reduce_sum", {x}, {{"axes", std::vector<std::int64_t>{1}}}, "total");
  g.mark_output(y);
  std::string j = to_json(g);
  EXPECT_NE(j.find("\"reduce_sum\""), std::string::npos);
  EXPECT_NE(j.find("\"total\""), std::string::npos);
  std::string d = to_dot(g);
  EXPECT_NE(d.find("digraph"), std::string::npos);
  EXPECT_NE(d.find("n0 -> n1"), std::string::npos);
  EXPECT_NE(d.find("f32[2]"), std::string::npos);
}

TEST(Autodiff, ErrorsAndUnconnectedInputs) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {3});
  Value unused = b.input("u", DType::kF32, {2});
  Value labels = b.input("l", DType::kI32, {3});
  Value loss = b.reduce_sum(b.mul(x, x), {});
  auto gr = autodiff(g, loss, {x, unused});
  ASSERT_TRUE(gr.ok()) << gr.status().to_string();
  EXPECT_EQ(g.type((*gr)[1]).shape, (Shape{2}));  // zeros for an unconnected input
  expect_msg(autodiff(g, labels, {x}).status(), {"floating"});
  // An op without a gradient rule on the path is named.
  Value s = b.op("sign", {x});
  Value l2 = b.reduce_sum(b.op("gelu_grad", {x, s}), {});
  expect_msg(autodiff(g, l2, {x}).status(), {"gelu_grad", "no gradient rule"});
}

}  // namespace
}  // namespace shoal::graph
