#include "shoal/core/status.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <thread>

#include "shoal/core/deadline.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"

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

// A repeated warning is let through up to a burst per period; the first
// line after that says how many were held back (one client looping on a
// refused connection wrote 12,427 lines in 28 s before).
TEST(LineBudget, LetsABurstThroughThenCountsTheRest) {
  log::LineBudget budget(3, std::chrono::seconds(1));
  std::uint64_t held = 99;
  int logged = 0;
  for (int i = 0; i < 1000; ++i) logged += budget.take(&held) ? 1 : 0;
  EXPECT_EQ(logged, 3);
  EXPECT_EQ(budget.total(), 1000u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(budget.take(&held));
  EXPECT_EQ(held, 997u);  // the ones held back in the last period
  ASSERT_TRUE(budget.take(&held));
  EXPECT_EQ(held, 0u);
}

}  // namespace
}  // namespace shoal
