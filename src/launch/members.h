// What `shoal run --elastic` knows of each member of the job, by rank id,
// and how it starts a newcomer: the coordinator's view of the processes
// (launch/elastic_coordinator.h decides the generations from it). Two
// engines, two views:
//  - LocalMembers: the local engine's processes, one per rank id, which
//    the launcher waits on, sees stopped (state T) and kills.
//  - RemoteMembers: ranks inside srun steps, on any node, or started by
//    something else altogether (--engine external: Kubernetes, a script on
//    each host). Their processes are out of reach, so a rank is known by
//    what srun says of its task ("task 2: Killed"), by the rank's lease in
//    the store (a count it raises twice a second; stopped: frozen, dead or
//    cut off) and by the exit it records there. A rank dropped from the job
//    cannot be killed from here: should it wake, the next generation
//    refuses it by id.
// Private to launch.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "launch/output.h"
#include "launch/process.h"
#include "shoal/core/status.h"
#include "shoal/net/store.h"

namespace shoal::launch {

// One member as the launcher sees it.
struct Seen {
  enum class State {
    kRunning,    // alive as far as the launcher can tell
    kEndedWell,  // exited with code 0
    kFailed,     // ended otherwise (`why`: how; `code`: its exit code)
    kSilent,     // stopped, frozen or cut off (`why`: what the launcher saw)
  };
  State state = State::kRunning;
  std::string why;
  int code = 0;
  // Seconds since the last sign of life (a remote rank's lease; 0 for a
  // process the launcher watches itself).
  double quiet_s = 0;
};

class Members {
 public:
  virtual ~Members() = default;
  virtual Seen seen(int id) = 0;
  // Ends a member dropped from the job, where the launcher can: true if it did.
  virtual bool drop(int id) = 0;
  // Starts rank id `id` as a newcomer (SHOAL_ELASTIC_JOIN) of a job of
  // `ranks` first ranks.
  virtual Status start(int id, int ranks) = 0;
  // The job is over: ends what still runs of it (ranks dropped, which the
  // launcher could not kill one by one, and newcomers never admitted).
  virtual void release() {}
  // Whether ranks the launcher did not start may join (they claim their
  // ids in the store): then it looks for them there.
  virtual bool others_join() const { return false; }
};

using Env = std::vector<std::pair<std::string, std::string>>;

class LocalMembers : public Members {
 public:
  // procs[id] is rank id's process; `frozen` and `output` grow with it.
  LocalMembers(std::vector<Proc>& procs, std::vector<bool>& frozen, Output& output, Env env,
               std::vector<std::string> cmd)
      : procs_(procs),
        frozen_(frozen),
        output_(output),
        env_(std::move(env)),
        cmd_(std::move(cmd)) {}
  Seen seen(int id) override;
  bool drop(int id) override;
  Status start(int id, int ranks) override;

 private:
  std::vector<Proc>& procs_;
  std::vector<bool>& frozen_;
  Output& output_;
  Env env_;
  std::vector<std::string> cmd_;
};

class RemoteMembers : public Members {
 public:
  // Under srun, procs[0] is the step of the first `ranks` ranks (task t =
  // id t) and each newcomer gets a step of its own, appended to procs;
  // `srun` is the engine's command before the rank's (srun and its
  // arguments). Empty `srun` and procs: the ranks are started elsewhere
  // (--engine external), and so are their replacements. A lease that does
  // not move for `lease_s` is a silent member.
  RemoteMembers(std::vector<Proc>& procs, std::vector<bool>& frozen, Output& output, Env env,
                std::vector<std::string> srun, std::vector<std::string> cmd, int ranks,
                std::unique_ptr<net::Store> store, double lease_s);
  Seen seen(int id) override;
  bool drop(int id) override;
  Status start(int id, int ranks) override;
  // srun's own abort: two interrupts within a second cancel the step, and
  // Slurm kills its tasks, stopped ones too (nothing under external).
  void release() override;
  bool others_join() const override { return srun_.empty(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Lease {
    std::string count;  // the last value read
    Clock::time_point moved{}, read{};
    Seen last;  // what the last look said
  };
  Seen look(int id, Lease& l);
  std::vector<Proc>& procs_;
  std::vector<bool>& frozen_;
  Output& output_;
  Env env_;
  std::vector<std::string> srun_, cmd_;
  int ranks_;
  std::unique_ptr<net::Store> store_;
  double lease_s_;
  std::map<int, int> unit_of_;  // newcomer id -> its step's process
  std::map<int, Lease> leases_;
};

}  // namespace shoal::launch
