// The ranks' side of an elastic job's generations (dist/elastic.h) against
// a real store, with this test in the launcher's place: a rank the launcher
// left out of the next generation (it froze, and woke after its peers went
// on) is refused by generation and told why; it writes nothing more. A
// member goes on at its place in the new generation.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <thread>

#include "shoal/core/elastic_keys.h"
#include "shoal/dist/elastic.h"
#include "shoal/net/store.h"

namespace shoal::dist {
namespace {

namespace keys = elastic_keys;

class ElasticGeneration : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = net::TcpStoreServer::start("127.0.0.1", 0, "tok");
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server_ = std::move(s).value();
    auto c =
        net::TcpStore::connect("127.0.0.1", server_->port(), Deadline::after_seconds(10), "tok");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    launcher_ = std::move(c).value();
    // Generation 0: ids 0, 1, 2, as `shoal run -n 3 --elastic 2` starts it.
    ASSERT_TRUE(launcher_->set(keys::members(0), "0,1,2").ok());
    ASSERT_TRUE(launcher_->set(keys::key("gen"), "0").ok());
    setenv("SHOAL_STORE", fmt::format("127.0.0.1:{}", server_->port()).c_str(), 1);
    setenv("SHOAL_JOB_TOKEN", "tok", 1);
    setenv("SHOAL_WORLD_SIZE", "3", 1);
    setenv("SHOAL_ELASTIC", "2", 1);
  }
  void TearDown() override {
    for (const char* v : {"SHOAL_STORE", "SHOAL_JOB_TOKEN", "SHOAL_WORLD_SIZE", "SHOAL_ELASTIC",
                          "SHOAL_RANK", "SHOAL_ELASTIC_GENERATION", "SHOAL_COMM_PREFIX",
                          "SHOAL_LOCAL_RANK", "SHOAL_LOCAL_WORLD_SIZE"})
      unsetenv(v);
  }
  // Rank `rank` of generation 0 as the launcher started it.
  ElasticEnv rank_env(int rank) {
    setenv("SHOAL_RANK", std::to_string(rank).c_str(), 1);
    auto e = elastic_env();
    EXPECT_TRUE(e.ok() && e->has_value()) << e.status().to_string();
    return e.ok() && e->has_value() ? **e : ElasticEnv{};
  }
  // The launcher forms generation 1 of ids 0 and 1 (id 2 froze).
  void drop_two() {
    ASSERT_TRUE(launcher_->set(keys::note(1), "rank 2 was stopped (state T)").ok());
    ASSERT_TRUE(launcher_->set(keys::members(1), "0,1").ok());
    ASSERT_TRUE(launcher_->set(keys::key("gen"), "1").ok());
  }
  std::unique_ptr<net::TcpStoreServer> server_;
  std::unique_ptr<net::TcpStore> launcher_;
};

TEST_F(ElasticGeneration, ARankThatWakesAfterItWasDroppedIsRefusedByGeneration) {
  ElasticEnv stale = rank_env(2);
  ASSERT_EQ(stale.id, 2);
  drop_two();
  // It wakes, finds its step failed, and checks in holding step 40.
  auto r = next_generation(stale, 40, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("rank id 2 was dropped from the job at generation 1 (its "
                                      "members: 0,1): it is stale and writes nothing more"),
            std::string::npos)
      << r.status().to_string();
  // It entered no generation: its rank variables are generation 0's.
  EXPECT_EQ(stale.generation, 0);
  EXPECT_EQ(std::string(getenv("SHOAL_RANK")), "2");
}

TEST_F(ElasticGeneration, AMemberGoesOnAtItsPlaceInTheNextGeneration) {
  ElasticEnv member = rank_env(1);
  drop_two();
  auto r = next_generation(member, 40, 5);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(member.generation, 1);
  EXPECT_EQ(member.rank, 1);
  EXPECT_EQ(member.world, 2);
  EXPECT_EQ(std::string(getenv("SHOAL_COMM_PREFIX")), "shoal/g1");
  EXPECT_NE(r->find("\"kind\":\"membership\""), std::string::npos) << *r;
  // The launcher read its check-in: the step it holds.
  auto in = launcher_->peek(keys::check_in(0, 1));
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(*in, "40");
}

// A rank that claims its id (SHOAL_ELASTIC=join) may reach the launcher's
// store before the launcher has written the job's keys (`claims` last). It
// waits for them: before, it left with "the store holds no elastic job",
// and the pods formed a generation with a member missing (seen once under
// a loaded `make test`, in K8s.AnElasticJobsPodsClaimTheirPlaces...).
TEST_F(ElasticGeneration, ARankThatComesBeforeTheJobsKeysWaitsForThem) {
  setenv("SHOAL_ELASTIC", "join", 1);
  std::thread late([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    auto c =
        net::TcpStore::connect("127.0.0.1", server_->port(), Deadline::after_seconds(10), "tok");
    ASSERT_TRUE(c.ok());
    for (const auto& [k, v] : {std::pair{keys::max(), "3"}, std::pair{keys::min(), "2"},
                               std::pair{keys::world(), "3"}, std::pair{keys::claims(), "yes"}})
      ASSERT_TRUE((*c)->set(k, v).ok());
  });
  auto e = elastic_env();
  late.join();
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(e->has_value());
  EXPECT_EQ((*e)->id, 0);
  EXPECT_EQ((*e)->world, 3);
  EXPECT_TRUE((*e)->claimed);
}

}  // namespace
}  // namespace shoal::dist
