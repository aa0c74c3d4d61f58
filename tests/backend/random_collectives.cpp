// torus_random_collectives: the randomized collective test.
//
// Every rank derives the same cases from --seed and the case index (random
// op, dtype, size, reduce op, root, in place or not, group, buffer
// placement; random_cases.h), runs the ones whose group it belongs to, and
// checks its own results against an independent reference. Each op has a
// deadline (--deadline-ms): a hang becomes a TimeoutError and is counted;
// any exception is counted with its message. At the end rank 0 prints the
// counts and a last line "N passed, N failed"; the exit status is non-zero
// when anything failed.
//
// Launch: under mpirun (TORUS_BACKEND=mpi or ofi; the Torus bootstrap), or
// by any launcher that sets the TORUS_* bootstrap variables (e.g.
// scripts/netns_hosts.sh). --hosts gives the ofi backend an injected host
// map under mpirun (several "hosts" on one machine, as tests/ofi does).
//
// Groups come from a pool made once per job: the world, and splits of a
// dedicated full-size parent ("splitter"): all singletons, odd/even,
// reversed, one rank left out, and random partitions (non-contiguous,
// permuted, some ranks in none). The ranks of a case meet at a barrier
// through the Store (not the backend) after it, so that a rank stuck in a
// failing op cannot make its peers' next ops miss their deadlines. A failed
// op breaks its group: the failing rank says so in the Store before the
// barrier, the members skip the group's later cases (counted as skipped),
// and at the next sync point (every --sync-every cases, all ranks) broken
// groups are split anew. Rare cases split the world afresh and check the
// new groups. A watchdog thread ends the job with a report if a wait never
// returns despite the deadlines.
//
// Options (also --help):
//   --seed N           seed of the case list (default 1)
//   --cases N          number of cases (default 200)
//   --first N          index of the first case (default 0): --first K --cases 1 reruns case K
//   --max-bytes N      largest buffer of any rank in any op (default 1M; K and M suffixes)
//   --deadline-ms N    deadline of every op (default 30000)
//   --exclude LIST     comma-separated case families not to run: op names (all_reduce, ...,
//                      send_recv, barrier), batch, split, dtype names, a2a-mixed-equal,
//                      half-multi-host (random_cases.h). Default: none.
//   --hosts SPEC       ofi under mpirun: fake host of each rank, "0,0,1", "blocks:H" or "cyclic:H"
//   --sync-every N     cases between sync points (default 25)
//   --max-splits N     most splits per job (pool, repairs and split cases; default 200)
//   --inject LIST      self-test: KIND@CASE,... with KIND one of wrong, clobber, hang, error,
//                      unclear, nonstd: a failure of that kind is faked on one rank in the first
//                      suitable case from CASE on, and must be counted like a real one
//   --verbose          print every case before it runs
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "random_cases.h"
#include "random_op.h"
#include "random_options.h"
#include "random_report.h"
#include "torus/comm/context.h"
#include "torus/comm/store.h"
#include "torus/core/error.h"

namespace torus::comm::rc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// What an exception was, as a category and a message. "Unclear": not a
// torus error, or a message that names neither the op nor the group.
struct Classified {
  Cat cat;
  std::string msg;
  bool unclear;
};
Classified classify(std::exception_ptr e, const std::string& op, const std::string& group) {
  auto named = [&](const std::string& m) {
    return m.find(op) != std::string::npos || (!group.empty() && m.find("'" + group + "'") != std::string::npos);
  };
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& x) {
    return {Cat::kHang, std::string("TimeoutError: ") + x.what(), !named(x.what())};
  } catch (const CommError& x) {
    return {Cat::kError, std::string("CommError: ") + x.what(), !named(x.what())};
  } catch (const InvalidArgument& x) {
    return {Cat::kError, std::string("InvalidArgument: ") + x.what(), !named(x.what())};
  } catch (const Unsupported& x) {
    return {Cat::kError, std::string("Unsupported: ") + x.what(), !named(x.what())};
  } catch (const Error& x) {
    return {Cat::kError, std::string("torus::Error: ") + x.what(), !named(x.what())};
  } catch (const std::exception& x) {
    return {Cat::kError, std::string("std::exception (not a torus error): ") + x.what(), true};
  } catch (...) {
    return {Cat::kError, "an exception that is not a std::exception", true};
  }
}

class Harness {
 public:
  explicit Harness(Options o) : opt_(std::move(o)) {}
  int run();

 private:
  void boot();
  void make_pool_groups();
  BackendPtr split_partition(size_t p, const std::string& tag);
  void run_case(const Case& c);
  void run_ops(const Case& c);
  void run_split_case(const Case& c);
  void case_barrier(const Case& c);
  bool participants_include_me(const Case& c) const;
  void sync(const std::string& name);
  int finish();
  void arm_watchdog(uint64_t index, const char* phase);
  void watchdog();

  bool excluded(const Case& c, std::string* why) const;
  std::vector<int> participants(const Case& c) const;
  bool member(size_t g) const;
  void compute_injection_targets();
  const Injection* injection_for(const Case& c) const;
  void record(uint64_t index, Cat cat, std::string msg, bool unclear = false, bool injected = false);
  std::string broken_key(size_t g) const { return fmt::format("broken/{}/{}", g, generation_[g]); }
  std::string group_label(size_t g) const;
  Duration deadline() const { return Duration(opt_.deadline_ms); }
  // How long a rank may wait for its peers at a case barrier or sync point:
  // a peer may spend a whole deadline and its grace in each op of a batch
  // (they overlap), then check its results.
  Duration stall_limit() const { return Duration(opt_.deadline_ms + 2 * kGraceMs + 60000); }
  void wait_for_count(const std::string& key, int64_t count, Duration timeout);

  static constexpr int64_t kGraceMs = 10000;  // how long past its deadline an op may report

  Options opt_;
  Limits limits_;
  std::shared_ptr<Context> ctx_;
  HostMap hosts_;
  BackendPtr world_;  // the world under test (the Context's, or an ofi world on --hosts)
  std::shared_ptr<Store> ctl_;
  BackendPtr splitter_;
  bool splitter_broken_ = false;
  int splits_ = 0;
  int n_ = 1, me_ = 0;
  Pool pool_;
  std::vector<BackendPtr> groups_;  // per pool group: this rank's backend, or null
  std::vector<int> generation_;
  std::vector<bool> broken_;
  std::vector<std::unique_ptr<OpRun>> graveyard_;  // failed ops keep their buffers
  // Groups replaced after a failure are kept, not destroyed: a peer that
  // freed its side of an MPI communicator with a late message still in
  // flight could see that message misdelivered to a new communicator that
  // reuses the context id (Note [Abandoned requests] in mpi_runtime.h).
  std::vector<BackendPtr> retired_;
  std::vector<Record> records_;
  uint64_t ran_ = 0;  // cases this rank took part in
  int syncs_ = 0;
  Clock::time_point start_;
  // The watchdog: a wait that never returns (one the deadlines cannot
  // break) ends the job with a report instead of hanging it.
  std::atomic<uint64_t> wd_case_{0};
  std::atomic<const char*> wd_phase_{"start"};
  std::atomic<int64_t> wd_since_ms_{0};
  std::atomic<bool> wd_stop_{false};
  std::thread wd_thread_;
};

void Harness::boot() {
  InitOptions io;
  // --hosts: the Context boots with mpi (store, MPI hand-off), and the ofi
  // world under test is made here with the injected host map.
  if (!opt_.hosts.empty()) io.host_backend = "mpi";
  ctx_ = Context::create(io);
  n_ = ctx_->world_size();
  me_ = ctx_->rank();
  if (!opt_.hosts.empty()) {
    hosts_.host_of_rank = parse_hosts(opt_.hosts, n_);
    int h = *std::max_element(hosts_.host_of_rank.begin(), hosts_.host_of_rank.end());
    for (int i = 0; i <= h; ++i) hosts_.hostnames.push_back(fmt::format("fake-host-{}", i));
    BackendInit init{&ctx_->launch(), &hosts_, ctx_->store(), Duration(120000)};
    world_ = create_world_backend("ofi", init);
  } else {
    hosts_ = ctx_->hosts();
    world_ = ctx_->host_backend();
  }
  ctl_ = std::make_shared<PrefixStore>("random-collectives", ctx_->store());
  limits_.max_bytes = opt_.max_bytes;
}

std::string Harness::group_label(size_t g) const {
  const GroupSpec& s = pool_.groups[g];
  std::vector<int> hosts;
  for (int r : s.members) hosts.push_back(hosts_.host_of_rank[static_cast<size_t>(r)]);
  std::string label = fmt::format("'{}' world ranks [{}]", s.name, fmt::join(s.members, ","));
  if (hosts_.num_hosts() > 1) label += fmt::format(" on hosts [{}]", fmt::join(hosts, ","));
  return label;
}

void Harness::record(uint64_t index, Cat cat, std::string msg, bool unclear, bool injected) {
  if (cat == Cat::kPass) return;
  if (is_failure(cat)) {
    std::fprintf(stderr, "random_collectives: FAIL [%s] rank %d: %s\n", std::string(cat_name(cat)).c_str(), me_,
                 msg.c_str());
    std::fflush(stderr);
  }
  records_.push_back({index, cat, unclear, injected, me_, std::move(msg)});
}

// Splits partition p of the pool from the splitter; collective over the world.
BackendPtr Harness::split_partition(size_t p, const std::string& tag) {
  const Partition& part = pool_.partitions[p];
  const int color = part.color[static_cast<size_t>(me_)];
  ++splits_;
  return splitter_->split(color, part.key[static_cast<size_t>(me_)], fmt::format("p{}c{}{}", p, color, tag),
                          deadline());
}

void Harness::make_pool_groups() {
  pool_ = make_pool(opt_.seed, n_, opt_.random_partitions);
  groups_.assign(pool_.groups.size(), nullptr);
  generation_.assign(pool_.groups.size(), 0);
  broken_.assign(pool_.groups.size(), false);
  groups_[0] = world_;
  try {
    ++splits_;
    splitter_ = world_->split(0, me_, "splitter", deadline());
  } catch (...) {
    auto c = classify(std::current_exception(), "split", "world");
    record(kSetup, c.cat, "creating the splitter (split of the world): " + c.msg, c.unclear);
    splitter_broken_ = true;
    std::fill(broken_.begin() + 1, broken_.end(), true);
    return;
  }
  for (size_t p = 0; p < pool_.partitions.size(); ++p) {
    BackendPtr b;
    try {
      b = split_partition(p, "");
    } catch (...) {
      auto c = classify(std::current_exception(), "split", "splitter");
      record(kSetup, c.cat, fmt::format("split of pool partition {}: {}", p, c.msg), c.unclear);
      // Its groups are split anew at the first sync point.
      for (size_t g = 1; g < pool_.groups.size(); ++g) {
        if (pool_.groups[g].partition == static_cast<int>(p)) ctl_->set_string(broken_key(g), std::to_string(me_));
      }
    }
    for (size_t g = 1; g < pool_.groups.size(); ++g) {
      const GroupSpec& s = pool_.groups[g];
      if (s.partition != static_cast<int>(p)) continue;
      if (s.color != pool_.partitions[p].color[static_cast<size_t>(me_)]) continue;
      if (!b) {
        broken_[g] = true;
        continue;
      }
      // The group must be what split() promises: members ordered by (key, rank).
      const GroupInfo& gi = b->group();
      const int want_rank = static_cast<int>(std::find(s.members.begin(), s.members.end(), me_) - s.members.begin());
      if (gi.size != static_cast<int>(s.members.size()) || gi.rank != want_rank || gi.global_ranks != s.members) {
        record(kSetup, Cat::kWrong,
               fmt::format("split of pool partition {} gave group '{}' rank {}/{} of world ranks [{}]; expected rank "
                           "{}/{} of [{}]",
                           p, gi.name, gi.rank, gi.size, fmt::join(gi.global_ranks, ","), want_rank, s.members.size(),
                           fmt::join(s.members, ",")));
      }
      groups_[g] = b;
    }
  }
}

bool Harness::excluded(const Case& c, std::string* why) const {
  auto hit = [&](const std::string& f) {
    if (!opt_.exclude.count(f)) return false;
    *why = "excluded by --exclude " + f;
    return true;
  };
  if (c.split) return hit("split");
  if (c.ops.size() > 1 && hit("batch")) return true;
  for (const Op& op : c.ops) {
    const GroupSpec& s = pool_.groups[static_cast<size_t>(op.group)];
    std::vector<int> member_hosts;
    for (int r : s.members) member_hosts.push_back(hosts_.host_of_rank[static_cast<size_t>(r)]);
    const int n = static_cast<int>(s.members.size());
    if (hit(std::string(kind_name(op.kind)))) return true;
    if (op.kind != Kind::kBarrier && hit(std::string(dtype_name(op.dtype)))) return true;
    if (a2a_mixed_equal(op, n) && hit("a2a-mixed-equal")) return true;
    if (half_multi_host(op, member_hosts) && hit("half-multi-host")) return true;
  }
  return false;
}

// World ranks that take part in a case (every member of every op's group).
std::vector<int> Harness::participants(const Case& c) const {
  std::set<int> who;
  if (c.split) {
    for (int r = 0; r < n_; ++r) who.insert(r);
  }
  for (const Op& op : c.ops) {
    for (int r : pool_.groups[static_cast<size_t>(op.group)].members) who.insert(r);
  }
  return {who.begin(), who.end()};
}

bool Harness::member(size_t g) const {
  const auto& m = pool_.groups[g].members;
  return std::find(m.begin(), m.end(), me_) != m.end();
}

// The case each injection lands in: the first from its index on that runs
// ops and, for wrong/clobber, gives the group's first member an output.
// Every rank computes the same.
void Harness::compute_injection_targets() {
  const uint64_t end = opt_.first + opt_.cases;
  for (Injection& inj : opt_.inject) {
    for (uint64_t i = std::max(inj.at, opt_.first); i < end; ++i) {
      Case c = make_case(opt_.seed, i, pool_, n_, limits_);
      std::string why;
      if (c.split || excluded(c, &why)) continue;
      const GroupSpec& s = pool_.groups[static_cast<size_t>(c.ops[0].group)];
      bool taken = false;
      for (const Injection& other : opt_.inject) taken |= &other != &inj && other.target == i;
      if (taken) continue;
      if (inj.kind == "wrong" || inj.kind == "clobber") {
        const Op& op = c.ops[0];
        bool output = false;
        switch (op.kind) {
          case Kind::kAllReduce:
          case Kind::kReduceScatter:
          case Kind::kAllGather:
          case Kind::kBroadcast:
            output = op.count > 0;
            break;
          case Kind::kReduce:
            output = op.count > 0 && op.root == 0;
            break;
          case Kind::kAllToAll: {
            const size_t n = s.members.size();
            for (size_t r = 0; r < n; ++r) output |= op.a2a[r * n] > 0;
            break;
          }
          case Kind::kSendRecv:
            for (const Message& m : op.msgs) output |= m.dst == 0 && m.count > 0;
            break;
          case Kind::kBarrier:
            break;
        }
        if (!output) continue;
      }
      inj.target = i;
      inj.rank = s.members[0];
      break;
    }
  }
}

const Injection* Harness::injection_for(const Case& c) const {
  for (const Injection& inj : opt_.inject) {
    if (inj.target == c.index && inj.rank == me_) return &inj;
  }
  return nullptr;
}

void Harness::run_case(const Case& c) {
  arm_watchdog(c.index, "case");
  std::string why;
  if (excluded(c, &why)) {  // every rank knows this: no barrier
    if (participants_include_me(c)) record(c.index, Cat::kExcluded, why);
    return;
  }
  if (participants_include_me(c)) {
    ++ran_;
    if (c.split) {
      run_split_case(c);
    } else {
      run_ops(c);
    }
  }
  case_barrier(c);
  if (c.split && !splitter_broken_ && ctl_->check({"broken/splitter"})) splitter_broken_ = true;
  for (const Op& op : c.ops) {
    const size_t g = static_cast<size_t>(op.group);
    if (member(g) && !broken_[g] && ctl_->check({broken_key(g)})) broken_[g] = true;
  }
}

bool Harness::participants_include_me(const Case& c) const {
  const std::vector<int> who = participants(c);
  return std::binary_search(who.begin(), who.end(), me_);
}

void Harness::run_ops(const Case& c) {
  const std::vector<int> who = participants(c);
  std::string how;
  if (c.shuffled) how += ", ops issued in a rank-dependent order";
  if (c.threaded) how += ", a thread per group";
  if (c.wait == WaitStyle::kWait) how += ", waited with wait()";
  if (c.wait == WaitStyle::kPoll) how += ", waited by polling is_completed()";
  if (c.reverse_wait) how += ", waited for in reverse order";
  const std::string head = fmt::format("case {} (seed {}{})", c.index, opt_.seed, how);
  auto where = [&](const Op& op) {
    const size_t g = static_cast<size_t>(op.group);
    const auto& m = pool_.groups[g].members;
    const int grank = static_cast<int>(std::find(m.begin(), m.end(), me_) - m.begin());
    return fmt::format("on group {} (group rank {}/{}, world rank {})", group_label(g), grank, m.size(), me_);
  };
  if (opt_.verbose && who[0] == me_) {
    std::string ops;
    for (const Op& op : c.ops)
      ops += fmt::format("\n    {} on group {}", op.describe(), group_label(static_cast<size_t>(op.group)));
    std::printf("random_collectives: %s:%s\n", head.c_str(), ops.c_str());
    std::fflush(stdout);
  }
  // A group broken by an earlier failure: its members learnt it at the
  // barrier of that case; others ask the Store. Every participant skips.
  for (const Op& op : c.ops) {
    const size_t g = static_cast<size_t>(op.group);
    const bool broken = member(g) ? broken_[g] || !groups_[g] : ctl_->check({broken_key(g)});
    if (broken)
      return record(c.index, Cat::kSkipped,
                    fmt::format("{}: group '{}' broken by an earlier failure", head, pool_.groups[g].name));
  }
  const Injection* inj = injection_for(c);

  // This rank's ops, in case order; all issued before any is waited for.
  std::vector<size_t> mine;
  for (size_t k = 0; k < c.ops.size(); ++k) {
    if (member(static_cast<size_t>(c.ops[k].group))) mine.push_back(k);
  }
  std::vector<std::unique_ptr<OpRun>> runs(mine.size());
  std::vector<bool> ok(mine.size(), false), breaks(mine.size(), false);
  Cat worst = Cat::kPass;
  std::string worst_msg;
  bool unclear = false;
  auto note = [&](Cat cat, size_t i, const std::string& m, bool u = false) {
    if (cat <= worst) return;
    worst = cat;
    unclear = u;
    const Op& op = c.ops[mine[i]];
    worst_msg = fmt::format("{} {}: op {}/{} {}: {}", head, where(op), mine[i] + 1, c.ops.size(), op.describe(), m);
  };
  auto group_name = [&](size_t i) { return groups_[static_cast<size_t>(c.ops[mine[i]].group)]->group().name; };
  auto op_name = [&](size_t i) { return std::string(kind_name(c.ops[mine[i]].kind)); };
  // Prepare every op, then issue them all before waiting for any.
  bool prepared = true;
  for (size_t i = 0; i < mine.size() && prepared; ++i) {
    const Op& op = c.ops[mine[i]];
    try {
      runs[i] = std::make_unique<OpRun>(op, *groups_[static_cast<size_t>(op.group)], deadline());
    } catch (...) {
      auto x = classify(std::current_exception(), op_name(i), group_name(i));
      note(x.cat, i, "preparing its buffers threw " + x.msg, x.unclear);
      prepared = false;
    }
  }
  std::vector<bool> issued(mine.size(), false);
  std::vector<std::exception_ptr> issue_error(mine.size());
  // The order this rank issues in: case order, or (shuffled) grouped by a
  // rank-dependent key per group, ops of one group keeping their order.
  std::vector<size_t> order(mine.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto group_key = [&](size_t i) {
    return hash2(c.ops[0].key ^ static_cast<uint64_t>(me_), static_cast<uint64_t>(c.ops[mine[i]].group));
  };
  if (c.shuffled) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return group_key(a) < group_key(b); });
  }
  auto issue_in_order = [&](const std::vector<size_t>& list) {
    for (size_t i : list) {
      try {
        runs[i]->issue();
        issued[i] = true;
      } catch (...) {
        issue_error[i] = std::current_exception();
        return;  // later ops of this list would be matched against the wrong peers' ops
      }
    }
  };
  if (prepared && c.threaded) {
    std::map<int, std::vector<size_t>> by_group;
    for (size_t i : order) by_group[c.ops[mine[i]].group].push_back(i);
    std::vector<std::thread> threads;
    for (auto& [g, list] : by_group) threads.emplace_back(issue_in_order, std::cref(list));
    for (auto& t : threads) t.join();
  } else if (prepared) {
    issue_in_order(order);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (!issue_error[i]) continue;
    auto x = classify(issue_error[i], op_name(i), group_name(i));
    note(x.cat, i, "issuing it threw " + x.msg, x.unclear);
    breaks[i] = true;
  }
  if (!prepared) std::fill(breaks.begin(), breaks.end(), true);
  // Wait for every Work (in reverse order in some batches), the way the
  // case says: wait(timeout), wait(), or polling is_completed().
  std::vector<std::pair<size_t, OpRun::Issued*>> waits;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i]) continue;
    for (auto& w : runs[i]->works()) waits.emplace_back(i, &w);
  }
  if (c.reverse_wait) std::reverse(waits.begin(), waits.end());
  std::vector<bool> fine(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) fine[i] = issued[i];
  for (auto [i, w] : waits) {
    const auto guard = w->at + deadline() + milliseconds(kGraceMs);
    auto left = [&] {
      return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(guard - Clock::now()));
    };
    try {
      switch (c.wait) {
        case WaitStyle::kWait:
          w->work->wait();  // the backend's deadline must end it (else the watchdog does)
          break;
        case WaitStyle::kPoll:
          while (!w->work->is_completed() && Clock::now() < guard)
            std::this_thread::sleep_for(std::chrono::microseconds(20));
          w->work->wait(left());
          break;
        case WaitStyle::kWaitTimeout:
          w->work->wait(left());
          break;
      }
    } catch (...) {
      fine[i] = false;
      auto x = classify(std::current_exception(), op_name(i), group_name(i));
      if (!w->work->is_completed()) {
        x.msg = fmt::format("still not complete {} ms past its {} ms deadline (the backend did not enforce it): {}",
                            kGraceMs, opt_.deadline_ms, x.msg);
      }
      note(x.cat, i, x.msg, x.unclear);
      breaks[i] = true;
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i]) continue;
    if (!fine[i]) {
      // A failed op's buffers may still be written by a late peer (Note
      // [Abandoned requests] in mpi_runtime.h: raw buffers must then stay
      // valid until the process exits), and one never issued may share a
      // batch with such ops: keep them for good.
      graveyard_.push_back(std::move(runs[i]));
      continue;
    }
    ok[i] = true;
  }
  // Self-test: a failure of the requested kind faked after the real op.
  if (inj && !runs.empty() && mine[0] == 0 && ok[0]) {
    const std::string tag = fmt::format("[injected {}] ", inj->kind);
    try {
      if (inj->kind == "wrong") runs[0]->corrupt_output();
      if (inj->kind == "clobber") runs[0]->damage_output_guard();
      if (inj->kind == "hang") {
        WorkInfo wi;
        wi.group = group_name(0);
        auto never = std::make_shared<Work>(wi);  // nobody ever completes it
        never->wait(milliseconds(200));
      }
      if (inj->kind == "error") throw CommError("a made-up transport failure");
      if (inj->kind == "unclear") throw std::runtime_error("?");
      if (inj->kind == "nonstd") throw 42;
    } catch (...) {
      auto x = classify(std::current_exception(), op_name(0), group_name(0));
      note(x.cat, 0, tag + x.msg, x.unclear);
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i] || !ok[i]) continue;
    auto [cat, m] = runs[i]->check();
    if (inj && i == 0 && mine[0] == 0 && cat != Cat::kPass) m = fmt::format("[injected {}] {}", inj->kind, m);
    note(cat, i, m);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (!breaks[i]) continue;
    // The group is unusable now: its members skip it from here on, and it
    // is split anew at the next sync point.
    const size_t g = static_cast<size_t>(c.ops[mine[i]].group);
    broken_[g] = true;
    ctl_->set_string(broken_key(g), std::to_string(me_));
  }
  if (worst != Cat::kPass) record(c.index, worst, worst_msg, unclear, inj != nullptr);
}

// After a case every rank waits for all others (through the Store), so that
// a rank stuck in a failing op cannot make a peer's next op miss its
// deadline (a failure would cascade), and every member knows which groups
// the case broke.
void Harness::case_barrier(const Case& c) {
  if (n_ < 2) return;
  arm_watchdog(c.index, "case barrier");
  const std::string key = fmt::format("case/{}", c.index);
  if (ctl_->add(key, 1) == n_) {
    ctl_->set_string(key + "/go", "1");
    return;
  }
  try {
    ctl_->wait({key + "/go"}, stall_limit());
  } catch (const TimeoutError&) {
    std::fprintf(stderr,
                 "random_collectives: rank %d: the other ranks of case %llu did not finish it within %lld s (a wait "
                 "that never returns?); giving up\n",
                 me_, static_cast<unsigned long long>(c.index), static_cast<long long>(stall_limit().count() / 1000));
    std::fflush(nullptr);
    std::_Exit(3);
  }
}

void Harness::arm_watchdog(uint64_t index, const char* phase) {
  wd_case_ = index;
  wd_phase_ = phase;
  wd_since_ms_ = std::chrono::duration_cast<milliseconds>(Clock::now().time_since_epoch()).count();
}

void Harness::watchdog() {
  const int64_t limit = stall_limit().count() + 30000;
  while (!wd_stop_) {
    std::this_thread::sleep_for(milliseconds(500));
    const int64_t now = std::chrono::duration_cast<milliseconds>(Clock::now().time_since_epoch()).count();
    if (now - wd_since_ms_ > limit) {
      std::fprintf(stderr,
                   "random_collectives: rank %d: HANG: no progress for %lld s in case %llu (%s) of seed %llu; a wait "
                   "that never returns despite the deadlines; ending the job\n",
                   me_, static_cast<long long>((now - wd_since_ms_) / 1000),
                   static_cast<unsigned long long>(wd_case_.load()), wd_phase_.load(),
                   static_cast<unsigned long long>(opt_.seed));
      std::fflush(nullptr);
      std::_Exit(4);
    }
  }
}

// A split of the world from the splitter, each new group checked: its
// membership and order, and an all_gather of the members' world ranks.
void Harness::run_split_case(const Case& c) {
  const std::string head =
      fmt::format("case {} (seed {}): split with colors [{}] keys [{}] (world rank {})", c.index, opt_.seed,
                  fmt::join(c.split_partition.color, ","), fmt::join(c.split_partition.key, ","), me_);
  std::string why;
  if (excluded(c, &why)) return record(c.index, Cat::kExcluded, why);
  if (splitter_broken_) return record(c.index, Cat::kSkipped, head + ": the splitter is broken");
  if (splits_ >= opt_.max_splits) return record(c.index, Cat::kExcluded, "over --max-splits");
  const int color = c.split_partition.color[static_cast<size_t>(me_)];
  BackendPtr b;
  try {
    ++splits_;
    b = splitter_->split(color, c.split_partition.key[static_cast<size_t>(me_)], fmt::format("split{}", c.index),
                         deadline());
  } catch (...) {
    auto x = classify(std::current_exception(), "split", "splitter");
    splitter_broken_ = true;
    ctl_->set_string("broken/splitter", std::to_string(me_));
    return record(c.index, x.cat, head + ": split threw " + x.msg, x.unclear);
  }
  if (color < 0) {
    if (b) record(c.index, Cat::kWrong, head + ": color < 0 gave a group");
    return;
  }
  const std::vector<int> members = members_of(c.split_partition, color);
  const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), me_) - members.begin());
  if (!b) return record(c.index, Cat::kWrong, head + ": no group for color " + std::to_string(color));
  const GroupInfo& gi = b->group();
  if (gi.size != static_cast<int>(members.size()) || gi.rank != want_rank || gi.global_ranks != members) {
    return record(
        c.index, Cat::kWrong,
        fmt::format("{}: got rank {}/{} of world ranks [{}], expected rank {}/{} of [{}]", head, gi.rank, gi.size,
                    fmt::join(gi.global_ranks, ","), want_rank, members.size(), fmt::join(members, ",")));
  }
  std::vector<int64_t> out(members.size(), -1);
  int64_t mine = me_;
  try {
    b->all_gather(&mine, out.data(), 1, DType::kI64, deadline())->wait(deadline() + milliseconds(kGraceMs));
  } catch (...) {
    auto x = classify(std::current_exception(), "all_gather", gi.name);
    retired_.push_back(b);
    return record(c.index, x.cat, head + ": all_gather on the new group threw " + x.msg, x.unclear);
  }
  if (!std::equal(out.begin(), out.end(), members.begin())) {
    record(c.index, Cat::kWrong,
           fmt::format("{}: all_gather of world ranks on the new group gave [{}], expected [{}]", head,
                       fmt::join(out, ","), fmt::join(members, ",")));
  }
}

// Polls an add-counter until it reaches `count`.
void Harness::wait_for_count(const std::string& key, int64_t count, Duration timeout) {
  const auto until = Clock::now() + timeout;
  auto next_note = Clock::now() + std::chrono::seconds(60);
  for (int64_t v; (v = ctl_->add(key, 0)) < count;) {
    if (Clock::now() > until) {
      std::fprintf(stderr, "random_collectives: rank %d: only %lld of %lld ranks reached '%s' in %lld s; giving up\n",
                   me_, static_cast<long long>(v), static_cast<long long>(count), key.c_str(),
                   static_cast<long long>(timeout.count() / 1000));
      std::fflush(nullptr);
      std::_Exit(3);
    }
    if (Clock::now() > next_note) {
      std::fprintf(stderr, "random_collectives: rank %d: waiting at '%s' (%lld of %lld ranks there)\n", me_,
                   key.c_str(), static_cast<long long>(v), static_cast<long long>(count));
      next_note = Clock::now() + std::chrono::seconds(60);
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
}

// A sync point, through the Store: every rank arrives, then all see the same
// broken groups and split them anew (collective over the splitter).
void Harness::sync(const std::string& name) {
  ++syncs_;
  arm_watchdog(opt_.first, "sync point");
  ctl_->add("sync/" + name, 1);
  wait_for_count("sync/" + name, n_, stall_limit());
  if (!splitter_broken_ && ctl_->check({"broken/splitter"})) splitter_broken_ = true;
  std::vector<size_t> broken_partitions;
  bool world_broken = false;
  for (size_t g = 0; g < pool_.groups.size(); ++g) {
    // Every rank reads every group's mark (also of groups it is not in), so
    // that all make the same repairs.
    if (!ctl_->check({broken_key(g)})) continue;
    if (g == 0)
      world_broken = true;
    else
      broken_partitions.push_back(static_cast<size_t>(pool_.groups[g].partition));
  }
  if (splitter_broken_) return;
  std::sort(broken_partitions.begin(), broken_partitions.end());
  broken_partitions.erase(std::unique(broken_partitions.begin(), broken_partitions.end()), broken_partitions.end());
  try {
    if (world_broken) {
      ++generation_[0];
      ++splits_;
      retired_.push_back(groups_[0]);
      groups_[0] = splitter_->split(0, me_, fmt::format("world-r{}", generation_[0]), deadline());
      broken_[0] = false;
    }
    for (size_t p : broken_partitions) {
      BackendPtr b = split_partition(p, fmt::format("-r{}", syncs_));
      for (size_t g = 1; g < pool_.groups.size(); ++g) {
        if (pool_.groups[g].partition != static_cast<int>(p)) continue;
        ++generation_[g];
        broken_[g] = false;
        if (groups_[g]) retired_.push_back(groups_[g]);
        groups_[g] = pool_.groups[g].color == pool_.partitions[p].color[static_cast<size_t>(me_)] ? b : nullptr;
      }
    }
  } catch (...) {
    auto x = classify(std::current_exception(), "split", "splitter");
    record(kSetup, x.cat, "splitting broken groups anew at sync " + name + ": " + x.msg, x.unclear);
    splitter_broken_ = true;
    ctl_->set_string("broken/splitter", std::to_string(me_));
  }
}

int Harness::finish() {
  sync("final");
  arm_watchdog(opt_.first + opt_.cases, "final report");
  ctl_->set_string(fmt::format("result/{}", me_), serialize(records_, ran_));
  ctl_->add("results", 1);
  int rc = 0;
  bool teardown_safe = true;
  if (me_ == 0) {
    wait_for_count("results", n_, stall_limit());
    std::vector<Record> all;
    uint64_t participations = 0;
    for (int r = 0; r < n_; ++r) {
      uint64_t ran = 0;
      auto recs = deserialize(ctl_->get_string(fmt::format("result/{}", r), stall_limit()), r, &ran);
      participations += ran;
      all.insert(all.end(), recs.begin(), recs.end());
    }
    ReportContext rc_ctx{opt_,
                         std::string(world_->name()),
                         hosts_,
                         n_,
                         std::chrono::duration<double>(Clock::now() - start_).count(),
                         splits_,
                         [this](uint64_t i) { return make_case(opt_.seed, i, pool_, n_, limits_); }};
    const uint64_t failed = print_report(rc_ctx, std::move(all), participations, &teardown_safe);
    rc = failed > 0 ? 1 : 0;
    ctl_->set_string("verdict", fmt::format("{} {}", rc, teardown_safe ? 1 : 0));
  }
  const std::string verdict = ctl_->get_string("verdict", stall_limit());
  rc = verdict[0] - '0';
  teardown_safe = verdict.size() > 2 && verdict[2] == '1';
  ctl_->add("left", 1);
  if (me_ == 0) wait_for_count("left", n_, Duration(30000));
  if (!teardown_safe) {
    // An op timed out or failed somewhere: a backend may hold requests that
    // never complete, and tearing it down may wait for them. The result is
    // printed; leave now.
    std::fflush(nullptr);
    std::_Exit(rc);
  }
  return rc;
}

int Harness::run() {
  start_ = Clock::now();
  arm_watchdog(0, "start");
  boot();
  wd_thread_ = std::thread([this] { watchdog(); });
  if (std::string bad = check_reference(); !bad.empty()) record(kSetup, Cat::kWrong, bad);
  make_pool_groups();
  sync("pool");  // groups whose split failed anywhere are made again
  compute_injection_targets();
  if (me_ == 0) {
    std::fprintf(
        stderr, "random_collectives: backend %s, %d ranks, seed %llu, cases %llu from %llu, pool of %zu groups\n",
        std::string(world_->name()).c_str(), n_, static_cast<unsigned long long>(opt_.seed),
        static_cast<unsigned long long>(opt_.cases), static_cast<unsigned long long>(opt_.first), pool_.groups.size());
  }
  for (uint64_t k = 0; k < opt_.cases; ++k) {
    if (k > 0 && k % static_cast<uint64_t>(opt_.sync_every) == 0) {
      sync(std::to_string(k));
      if (me_ == 0) {
        size_t failures = 0;
        for (const Record& r : records_) failures += is_failure(r.cat);
        std::fprintf(stderr, "random_collectives: %llu/%llu cases, %.1f s, rank 0 saw %zu failures\n",
                     static_cast<unsigned long long>(k), static_cast<unsigned long long>(opt_.cases),
                     std::chrono::duration<double>(Clock::now() - start_).count(), failures);
      }
    }
    run_case(make_case(opt_.seed, opt_.first + k, pool_, n_, limits_));
  }
  const int rc = finish();
  wd_stop_ = true;
  wd_thread_.join();
  groups_.clear();
  splitter_.reset();
  world_.reset();
  ctx_.reset();
  return rc;
}

}  // namespace
}  // namespace torus::comm::rc

int main(int argc, char** argv) {
  using namespace torus::comm::rc;
  Options o = parse_options(argc, argv);
  try {
    Harness h(std::move(o));
    return h.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "random_collectives: fatal: %s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
}
