#include "shoal/core/status.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "shoal/core/deadline.h"
#include "shoal/core/env.h"

namespace shoal {
namespace {

Result<int> half(int x) {
  if (x % 2) return invalid_argument("{} is odd", x);
  return x / 2;
}

Result<int> quarter(int x) {
  SHOAL_ASSIGN_OR_RETURN(int h, half(x));
  return half(h);
}

TEST(Status, ResultPropagates) {
  EXPECT_EQ(*quarter(8), 2);
  auto r = quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "3 is odd");
  EXPECT_EQ(r.status().with_context("loading").to_string(), "INVALID_ARGUMENT: loading: 3 is odd");
}

TEST(Env, StrictParsing) {
  ::setenv("SHOAL_TEST_INT", "12", 1);
  EXPECT_EQ(*env::get_int("SHOAL_TEST_INT", 0), 12);
  ::setenv("SHOAL_TEST_INT", "12x", 1);
  auto bad = env::get_int("SHOAL_TEST_INT", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("SHOAL_TEST_INT"), std::string::npos);
  ::unsetenv("SHOAL_TEST_INT");
  EXPECT_EQ(*env::get_int("SHOAL_TEST_INT", 5), 5);
  ::setenv("SHOAL_TEST_BOOL", "maybe", 1);
  EXPECT_FALSE(env::get_bool("SHOAL_TEST_BOOL", false).ok());
}

TEST(Deadline, Expires) {
  Deadline d = Deadline::after(std::chrono::milliseconds(0));
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.remaining().count(), 0);
  EXPECT_FALSE(Deadline::after_seconds(60).expired());
}

}  // namespace
}  // namespace shoal
