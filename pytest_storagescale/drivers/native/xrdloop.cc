// The compiled client loop of the xrootd driver: one client's stat or whole-file get,
// back to back, outside Python. Loaded with ctypes (which releases the GIL for the
// call), so C clients in threads run their requests in parallel, with no GIL hand-over
// per request: a Python call of the XRootD bindings costs more client CPU than the
// request itself (docs/benchmarks.md), and on a small client host that CPU is the
// server's.
//
// One call of ss_run does up to n requests and comes back once `until` has passed or
// a request failed (so that the caller turns each failure into its driver's error):
// the engine records each request's end, latency, bytes and status as for a request
// made from Python, and times the call for hangs.
//
// A client's stat can also run in the background (ss_start ... ss_take): each answer's
// handler, in XrdCl's own threads, records the request and issues the next one, so no
// thread waits per client and none wakes per request (a thread per client costs two
// context switches per request: docs/benchmarks.md). The engine drains the records
// (ss_take), watches the request in flight for hangs (ss_since_address, ss_abandon) and
// waits for the last one after the stop (ss_wait_idle).
//
// Redirects: every request goes out asynchronously, its handler given the hosts XrdCl
// went through (HandleResponseWithHosts: the first server, then one per redirect, as
// a dCache door's open to a pool's mover or a redirector's to a data server); the hops
// past the first are counted per client (ss_redirects). A synchronous XrdCl call waits
// on such a handler itself and drops the host list, so the loop waits on its own.
//
// Built on first use (pytest_storagescale/drivers/native/__init__.py):
//   g++ -O2 -std=c++17 -shared -fPIC -I/usr/include/xrootd xrdloop.cc -lXrdCl
#include <XrdCl/XrdClFile.hh>
#include <XrdCl/XrdClFileSystem.hh>
#include <XrdCl/XrdClURL.hh>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

double monotonic() {  // Python's time.perf_counter() on Linux
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// what the Python bindings' XRootDStatus shows: its code, errno, level (status) and
// ToStr() (the server's own text included)
void fail(const XrdCl::XRootDStatus& status, int* code, int* err, int* level,
          char* message, int size) {
  *code = status.code ? status.code : XrdCl::errUnknown;
  *err = static_cast<int>(status.errNo);
  *level = static_cast<int>(status.status);
  if (message && size > 0) {
    std::snprintf(message, static_cast<size_t>(size), "%s", status.ToStr().c_str());
  }
}

// request i of a walk: paths[(first + i * step) % paths]
const std::string& walk_path(const std::vector<std::string>& paths, long long first,
                             long long step, long long i) {
  const long long files = static_cast<long long>(paths.size());
  return paths[((first + i * step) % files + files) % files];
}

// the redirects a request followed: the hosts it went through past the first
long long hops(const XrdCl::HostList* hosts) {
  return hosts && hosts->size() > 1 ? static_cast<long long>(hosts->size()) - 1 : 0;
}

// One request's answer, waited for by the calling thread (what XrdCl's synchronous
// calls do), with the hops of its host list added to `redirects`.
class Answer : public XrdCl::ResponseHandler {
 public:
  explicit Answer(std::atomic<long long>& redirects) : redirects_(redirects) {}
  ~Answer() override { delete response_; }  // a stat's StatInfo: not needed

  void HandleResponseWithHosts(XrdCl::XRootDStatus* status, XrdCl::AnyObject* response,
                               XrdCl::HostList* hosts) override {
    const long long followed = hops(hosts);
    delete hosts;
    if (followed) redirects_.fetch_add(followed, std::memory_order_relaxed);
    std::lock_guard<std::mutex> held(lock_);
    status_ = *status;
    delete status;
    response_ = response;
    done_ = true;
    answered_.notify_one();
  }

  // the request's status: `sent` (the call's own) when XrdCl refused to send it, else
  // the answer's, waited for (XrdCl always answers a sent request: its timeout too)
  XrdCl::XRootDStatus Wait(const XrdCl::XRootDStatus& sent) {
    if (!sent.IsOK()) return sent;
    std::unique_lock<std::mutex> held(lock_);
    answered_.wait(held, [this] { return done_; });
    return status_;
  }

 private:
  std::atomic<long long>& redirects_;
  std::mutex lock_;
  std::condition_variable answered_;
  bool done_ = false;
  XrdCl::XRootDStatus status_;
  XrdCl::AnyObject* response_ = nullptr;
};

// a request the background loop finished, until ss_take hands it out
struct Done {
  double finished, latency;
  long long index;
  int code, err, level;
  std::string message;
};

// the most finished requests a background loop keeps until ss_take: a loop that has
// this many pauses (ends, as at a refused request, and the engine begins it again
// after a pause), so that answers faster than the engine drains them (a storm of fast
// failures) never grow the memory
constexpr size_t kBacklog = 1u << 15;

struct Client : XrdCl::ResponseHandler {
  std::string server;  // root://<login>@host:port
  XrdCl::FileSystem fs;
  std::vector<std::string> paths;
  std::vector<char> buffer;
  // The background loop, all under `lock`: its walk; `active` from ss_start until no
  // request follows (halted, given up, refused); `issuing` while a thread is inside
  // fs.Stat (the handler may run before it returns, in another thread); `since`, the
  // start of the request in flight (0: none); the finished requests. A client freed
  // while active or issuing is deleted by the last thread to leave it.
  long long first = 0, step = 1, next = 0;
  uint16_t timeout = 60;
  // the step's end (monotonic seconds; 0: none): no request begins after it
  double until = 0.0;
  std::mutex lock;
  std::condition_variable settled;
  std::vector<Done> finished;
  std::atomic<int> pending{0};  // finished.size(), read by the engine without a call
  std::atomic<double> since{0.0};
  // redirects the client's requests followed (ss_redirects)
  std::atomic<long long> redirects{0};
  double began = 0.0;
  int issuing = 0;
  bool active = false, halted = false, abandoned = false, freed = false;
  explicit Client(const char* url) : server(url), fs{XrdCl::URL(url)} {}

  const std::string& path(long long i) const { return walk_path(paths, first, step, i); }

  // under the lock: the next request's number and start, or the end of the loop
  // (halted, given up, or a full backlog)
  bool Prepare(long long& index) {
    const double now = monotonic();
    if (halted || abandoned || finished.size() >= kBacklog || (until > 0.0 && now >= until)) {
      active = false;
      since.store(0.0);
      settled.notify_all();
      return false;
    }
    index = next++;
    began = now;
    since.store(began);
    ++issuing;
    return true;
  }

  bool Gone() const { return freed && !active && issuing == 0; }  // under the lock

  // Sends the prepared request `index` (the lock not held). A request refused before
  // it was sent is a finished request, and the loop ends there (never a busy loop of
  // refusals in XrdCl's threads: the engine starts it again after a pause). True if
  // the client is to be deleted now.
  bool Send(long long index) {
    XrdCl::XRootDStatus status;
    try {
      status = fs.Stat(path(index), this, timeout);
    } catch (const std::exception&) {
      status = XrdCl::XRootDStatus(XrdCl::stError, XrdCl::errInternal);
    }
    std::lock_guard<std::mutex> held(lock);
    --issuing;
    if (!status.IsOK()) {
      if (!abandoned) Record(status, monotonic(), index);  // given up: not measured
      active = false;
      since.store(0.0);
      settled.notify_all();
    }
    return Gone();
  }

  void Record(const XrdCl::XRootDStatus& status, double end, long long index) {
    try {
      Done done{end, end - began, index, 0, 0, 0, std::string()};
      if (!status.IsOK()) {
        fail(status, &done.code, &done.err, &done.level, nullptr, 0);
        done.message = status.ToStr();
      }
      finished.push_back(std::move(done));
      pending.store(static_cast<int>(finished.size()));
    } catch (const std::exception&) {  // out of memory: this request is not measured
    }
  }

  void HandleResponseWithHosts(XrdCl::XRootDStatus* status, XrdCl::AnyObject* response,
                               XrdCl::HostList* hosts) override {
    const long long followed = hops(hosts);
    delete hosts;
    if (followed) redirects.fetch_add(followed, std::memory_order_relaxed);
    HandleResponse(status, response);
  }

  void HandleResponse(XrdCl::XRootDStatus* status, XrdCl::AnyObject* response) override {
    double end = monotonic();
    long long index = 0;
    bool again = false, gone = false;
    {
      std::lock_guard<std::mutex> held(lock);
      if (!abandoned) Record(*status, end, next - 1);  // given up as hung: not measured
      again = Prepare(index);
      gone = !again && Gone();
    }
    delete status;
    delete response;
    if (again) gone = Send(index);
    if (gone) delete this;
  }
};

// stat: 0 bytes moved
bool stat_once(Client& c, const std::string& path, uint16_t timeout, long long* moved,
               int* code, int* err, int* level, char* message, int size) {
  Answer answer(c.redirects);
  XrdCl::XRootDStatus status = answer.Wait(c.fs.Stat(path, &answer, timeout));
  *moved = 0;
  if (!status.IsOK()) fail(status, code, err, level, message, size);
  return status.IsOK();
}

// get: open, the size the open answered, read it whole (8 MiB at a time), close
bool get_once(Client& c, const std::string& path, uint16_t timeout, long long* moved,
              int* code, int* err, int* level, char* message, int size) {
  const uint32_t chunk = 8u * 1024u * 1024u;
  XrdCl::File file;
  *moved = 0;
  Answer opened(c.redirects);
  XrdCl::XRootDStatus status = opened.Wait(
      file.Open(c.server + "/" + path, XrdCl::OpenFlags::Read, XrdCl::Access::None,
                &opened, timeout));
  if (!status.IsOK()) {
    fail(status, code, err, level, message, size);
    return false;
  }
  XrdCl::StatInfo* info = nullptr;
  long long total = -1;
  if (file.Stat(false, info, timeout).IsOK() && info) total = info->GetSize();
  delete info;
  long long done = 0;
  bool ok = true;
  while (true) {
    long long want = total < 0 ? chunk : std::min<long long>(chunk, total - done);
    if (want <= 0) break;
    if (c.buffer.size() < static_cast<size_t>(want)) c.buffer.resize(want);
    uint32_t got = 0;
    status = file.Read(static_cast<uint64_t>(done), static_cast<uint32_t>(want),
                       c.buffer.data(), got, timeout);
    if (!status.IsOK()) {
      fail(status, code, err, level, message, size);
      ok = false;
      break;
    }
    done += got;
    if (got < want) break;
  }
  XrdCl::XRootDStatus closed = file.Close(timeout);
  if (ok && !closed.IsOK()) {
    fail(closed, code, err, level, message, size);
    ok = false;
  }
  *moved = done;
  return ok;
}

}  // namespace

extern "C" {

void* ss_client_new(const char* server) { return new Client(server); }

// A client whose background loop still runs (a request given up as hung, or in
// flight at Ctrl-C) is halted, and deleted by the last thread to leave it.
void ss_client_free(void* client) {
  Client* c = static_cast<Client*>(client);
  {
    std::lock_guard<std::mutex> held(c->lock);
    c->halted = c->freed = true;
    if (!c->Gone()) return;
  }
  delete c;
}

// the files this client walks through (request i reads paths[(first + i * step) % n])
void ss_client_add_path(void* client, const char* path) {
  static_cast<Client*>(client)->paths.emplace_back(path);
}

// Up to n requests of `op` (0 stat, 1 get), request i on paths[(first + i * step) %
// paths], at least one unless *stop is set, none begun after monotonic() passed `until`
// or once *stop is set (Ctrl-C, from another thread), none after a failure. For each:
// finished (monotonic seconds), latency (seconds), bytes, code (0: success; else the
// XRootDStatus code), errno and level; `message` gets the failure's text. Every
// request has the deadline `timeout` (seconds). Returns how many were done.
int ss_run(void* handle, int op, long long first, long long step, int n, double until,
           uint16_t timeout, const volatile int* stop, double* finished, double* latency,
           long long* moved, int* code, int* err, int* level, char* message,
           int message_size) {
  Client& c = *static_cast<Client*>(handle);
  if (message && message_size > 0) message[0] = '\0';
  if (c.paths.empty() || n < 1) return 0;
  int done = 0;
  while (done < n && !*stop) {
    double began = monotonic();
    if (done > 0 && began > until) break;
    const std::string& path = walk_path(c.paths, first, step, done);
    code[done] = err[done] = level[done] = 0;
    try {
      if (op == 0)
        stat_once(c, path, timeout, &moved[done], &code[done], &err[done], &level[done],
                  message, message_size);
      else
        get_once(c, path, timeout, &moved[done], &code[done], &err[done], &level[done],
                 message, message_size);
    } catch (const std::exception& exc) {  // e.g. bad_alloc: never across extern "C"
      code[done] = XrdCl::errInternal;
      level[done] = XrdCl::stError;
      if (message && message_size > 0)
        std::snprintf(message, static_cast<size_t>(message_size),
                      "[ERROR] the compiled client loop: %s", exc.what());
    }
    double end = monotonic();
    finished[done] = end;
    latency[done] = end - began;
    if (code[done++] != 0) break;
  }
  return done;
}

// The background loop (stat only): request i on paths[(first + i * step) % paths],
// each issued when the last one ended, until ss_halt or `until` (monotonic seconds, the
// step's end: no request begins after it; 0: no end); every request has the deadline
// `timeout`. A loop that ended at a refused request (one XrdCl would not send) or at
// a full backlog (kBacklog) may be started again. Returns 0 (started), 1 (running, halted or given up: not started),
// or -1 without paths.
int ss_start(void* handle, long long first, long long step, uint16_t timeout, double until) {
  Client& c = *static_cast<Client*>(handle);
  long long index = 0;
  {
    std::lock_guard<std::mutex> held(c.lock);
    if (c.paths.empty()) return -1;
    if (c.active || c.halted || c.abandoned) return 1;  // running, or ended for good
    c.first = first;
    c.step = step;
    c.timeout = timeout;
    c.until = until;
    c.active = true;
    if (!c.Prepare(index)) return 0;
  }
  c.Send(index);  // not freed meanwhile: ss_client_free comes from this same caller
  return 0;
}

// Up to n finished requests of the background loop, oldest first: end, latency, the
// request's number (i above), code, errno, level. The failures of one call share one
// text (in `message`): a failure whose text differs from the first one's waits for the
// next call. So a storm of the same fast failure (a target removed: "not found" at once)
// costs one call per n requests, as successes do. Returns how many.
int ss_take(void* handle, int n, double* finished, double* latency, long long* index,
            int* code, int* err, int* level, char* message, int message_size) {
  Client& c = *static_cast<Client*>(handle);
  if (message && message_size > 0) message[0] = '\0';
  std::lock_guard<std::mutex> held(c.lock);
  int taken = 0, size = static_cast<int>(c.finished.size());
  const std::string* text = nullptr;  // the first failure's
  while (taken < n && taken < size) {
    const Done& d = c.finished[taken];
    if (d.code != 0) {
      if (text == nullptr) {
        text = &d.message;
        if (message && message_size > 0)
          std::snprintf(message, static_cast<size_t>(message_size), "%s", d.message.c_str());
      } else if (d.message != *text) {
        break;
      }
    }
    finished[taken] = d.finished;
    latency[taken] = d.latency;
    index[taken] = d.index;
    code[taken] = d.code;
    err[taken] = d.err;
    level[taken] = d.level;
    ++taken;
  }
  c.finished.erase(c.finished.begin(), c.finished.begin() + taken);
  c.pending.store(static_cast<int>(c.finished.size()));
  return taken;
}

// the redirects the client's requests have followed so far (both loops)
long long ss_redirects(void* handle) {
  return static_cast<Client*>(handle)->redirects.load(std::memory_order_relaxed);
}

// the most finished requests a background loop keeps (kBacklog)
int ss_backlog() { return static_cast<int>(kBacklog); }

// the background loop begins no further request (Ctrl-C, the step's end)
void ss_halt(void* handle) {
  Client& c = *static_cast<Client*>(handle);
  std::lock_guard<std::mutex> held(c.lock);
  c.halted = true;
  c.settled.notify_all();
}

// where the engine reads, without a call, the start of the request in flight
// (monotonic seconds; 0: none in flight) and the count of finished requests not taken
// yet (lock-free atomics: a double and an int in memory), while the client is not freed
const double* ss_since_address(void* handle) {
  static_assert(sizeof(std::atomic<double>) == sizeof(double) &&
                std::atomic<double>::is_always_lock_free, "a plain double in memory");
  return reinterpret_cast<const double*>(&static_cast<Client*>(handle)->since);
}
const int* ss_pending_address(void* handle) {
  static_assert(sizeof(std::atomic<int>) == sizeof(int) &&
                std::atomic<int>::is_always_lock_free, "a plain int in memory");
  return reinterpret_cast<const int*>(&static_cast<Client*>(handle)->pending);
}

// Give up the request in flight that began at `since` (a hang): it is not measured,
// and no further request follows. 1 if it was still in flight, else 0.
int ss_abandon(void* handle, double since) {
  Client& c = *static_cast<Client*>(handle);
  std::lock_guard<std::mutex> held(c.lock);
  if (since == 0.0 || c.since.load() != since) return 0;
  c.abandoned = true;
  c.since.store(0.0);
  c.settled.notify_all();
  return 1;
}

// Wait at most `seconds` until the background loop has ended (halted, its last
// request finished, or given up). 1 if so.
int ss_wait_idle(void* handle, double seconds) {
  Client& c = *static_cast<Client*>(handle);
  std::unique_lock<std::mutex> held(c.lock);
  auto ended = [&c] { return !c.active || c.abandoned; };
  c.settled.wait_for(held, std::chrono::duration<double>(seconds), ended);
  return ended() ? 1 : 0;
}

}  // extern "C"
