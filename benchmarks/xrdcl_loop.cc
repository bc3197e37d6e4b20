// The physical limit of an XRootD client host: C threads, each with its own
// XrdCl::FileSystem and login name (so its own connection, as the plugin's clients),
// calling stat (or reading / writing a whole file) back to back for a duration.
//
// Built by benchmarks/bench_engine.py into a build folder:
//   g++ -O2 -std=c++17 -I/usr/include/xrootd xrdcl_loop.cc -o xrdcl_loop -lXrdCl -lpthread
// Usage:
//   xrdcl_loop --host 127.0.0.1 --port 1094 --path /area/target --clients 50
//              [--op stat|get|put] [--size 1000000] [--warmup 2] [--duration 5]
//              [--tag x] [--processes 1] [--mode threads|async]
// --mode async (stat only): no thread per client; each client's next stat is issued
// from its last one's response handler, in XrdCl's threads.
// --processes P forks P processes before the library is touched, each with its share
// of the clients (sharding like the plugin's processes executor).
// Prints one JSON line: clients, processes, succeeded, failed, rate_hz, mb_s, cpu_s
// (user + system of every process over the measured window), rss_mb (summed peak RSS).

#include <XrdCl/XrdClFile.hh>
#include <XrdCl/XrdClFileSystem.hh>
#include <XrdCl/XrdClURL.hh>

#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  std::string host = "127.0.0.1";
  int port = 1094;
  std::string path = "/";
  std::string op = "stat";
  std::string tag = "x";
  std::string mode = "threads";
  int clients = 1;
  int processes = 1;
  long size = 1000000;
  double warmup = 2.0;
  double duration = 5.0;
};

double now() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

// client names: <tag><index>, 8 characters at most (the XRootD login's user name)
std::string login(const Options& o, int index) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%0*d", o.tag.c_str(),
                static_cast<int>(8 - o.tag.size()), index);
  return std::string(name).substr(0, 8);
}

double cpu_seconds() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
         usage.ru_stime.tv_usec / 1e6;
}

void sleep_until(double t) {
  double left = t - now();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

struct Counts {
  std::atomic<long> ok{0}, failed{0}, bytes{0};
};

bool one(const Options& o, XrdCl::FileSystem& fs, const std::string& server,
         std::vector<char>& buffer, long& moved) {
  moved = 0;
  if (o.op == "stat") {
    XrdCl::StatInfo* info = nullptr;
    XrdCl::XRootDStatus st = fs.Stat(o.path, info, 30);
    delete info;
    return st.IsOK();
  }
  XrdCl::File file;
  std::string url = server + "/" + o.path;
  if (o.op == "get") {
    if (!file.Open(url, XrdCl::OpenFlags::Read, XrdCl::Access::None, 30).IsOK()) return false;
    uint32_t got = 0;
    bool ok = file.Read(0, static_cast<uint32_t>(buffer.size()), buffer.data(), got, 30).IsOK();
    moved = got;
    return file.Close(30).IsOK() && ok;
  }
  // put: a new file each time (as the plugin's put), <path>/<login>-<n>
  static thread_local long count = 0;
  url += "-" + std::to_string(count++);
  if (!file.Open(url, XrdCl::OpenFlags::Delete | XrdCl::OpenFlags::MakePath,
                 XrdCl::Access::UR | XrdCl::Access::UW, 30).IsOK())
    return false;
  bool ok = file.Write(0, static_cast<uint32_t>(buffer.size()), buffer.data(), 30).IsOK();
  moved = ok ? static_cast<long>(buffer.size()) : 0;
  return file.Close(30).IsOK() && ok;
}

void client(const Options& o, int index, double measure_from, double end_at,
            std::atomic<int>& ready, Counts& counts) {
  std::string server = "root://" + login(o, index) + "@" + o.host + ":" +
                       std::to_string(o.port);
  XrdCl::FileSystem fs{XrdCl::URL(server)};
  std::vector<char> buffer(o.op == "stat" ? 0 : o.size, 'x');
  Options mine = o;
  if (o.op == "put") mine.path = o.path + "/" + login(o, index);
  XrdCl::StatInfo* info = nullptr;
  XrdCl::XRootDStatus first = fs.Stat("/", info, 30);  // log in before the clock runs
  (void)first;
  delete info;
  ready.fetch_add(1);
  long moved = 0;
  while (true) {
    bool ok = one(mine, fs, server, buffer, moved);
    double t = now();
    if (t > end_at) return;
    if (t < measure_from) continue;
    if (ok) {
      counts.ok.fetch_add(1, std::memory_order_relaxed);
      counts.bytes.fetch_add(moved, std::memory_order_relaxed);
    } else {
      counts.failed.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

// --mode async: no thread per client; each client's next stat is issued from the
// response handler of its last one (XrdCl's own threads run the handlers)
struct AsyncClient : XrdCl::ResponseHandler {
  const Options* o = nullptr;
  XrdCl::FileSystem* fs = nullptr;
  Counts* counts = nullptr;
  std::atomic<int>* running = nullptr;
  double measure_from = 0, end_at = 0;

  void Issue() {
    if (!fs->Stat(o->path, this, 30).IsOK()) {
      counts->failed.fetch_add(1, std::memory_order_relaxed);
      running->fetch_sub(1);
    }
  }
  void HandleResponse(XrdCl::XRootDStatus* status, XrdCl::AnyObject* response) override {
    bool ok = status->IsOK();
    delete status;
    delete response;
    double t = now();
    if (t >= measure_from && t <= end_at) {
      if (ok) counts->ok.fetch_add(1, std::memory_order_relaxed);
      else counts->failed.fetch_add(1, std::memory_order_relaxed);
    }
    if (t > end_at) {
      running->fetch_sub(1);
      return;
    }
    Issue();
  }
};

void run_share_async(const Options& o, int first, int step, double start_at, int out) {
  Counts counts;
  std::atomic<int> running{0};
  double measure_from = start_at + o.warmup, end_at = measure_from + o.duration;
  std::vector<std::unique_ptr<XrdCl::FileSystem>> systems;
  std::vector<std::unique_ptr<AsyncClient>> clients;
  for (int i = first; i < o.clients; i += step) {
    std::string server = "root://" + login(o, i) + "@" + o.host + ":" +
                         std::to_string(o.port);
    systems.emplace_back(new XrdCl::FileSystem{XrdCl::URL(server)});
    auto* c = new AsyncClient;
    c->o = &o;
    c->fs = systems.back().get();
    c->counts = &counts;
    c->running = &running;
    c->measure_from = measure_from;
    c->end_at = end_at;
    clients.emplace_back(c);
  }
  sleep_until(start_at);
  running = static_cast<int>(clients.size());
  for (auto& c : clients) c->Issue();
  sleep_until(measure_from);
  double cpu_from = cpu_seconds();
  sleep_until(end_at);
  double cpu = cpu_seconds() - cpu_from;
  while (running.load() > 0 && now() < end_at + 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  double values[4] = {static_cast<double>(counts.ok.load()),
                      static_cast<double>(counts.failed.load()),
                      static_cast<double>(counts.bytes.load()), cpu};
  if (write(out, values, sizeof values) != sizeof values) std::perror("write");
}

// one process's share: clients first, first + step, ...
void run_share(const Options& o, int first, int step, double start_at, int out) {
  Counts counts;
  std::atomic<int> ready{0};
  double measure_from = start_at + o.warmup, end_at = measure_from + o.duration;
  std::vector<std::thread> threads;
  for (int i = first; i < o.clients; i += step)
    threads.emplace_back(client, std::cref(o), i, measure_from, end_at, std::ref(ready),
                         std::ref(counts));
  // this process's CPU over the measured window only
  sleep_until(measure_from);
  double cpu_from = cpu_seconds();
  sleep_until(end_at);
  double cpu = cpu_seconds() - cpu_from;
  for (auto& t : threads) t.join();
  double values[4] = {static_cast<double>(counts.ok.load()),
                      static_cast<double>(counts.failed.load()),
                      static_cast<double>(counts.bytes.load()), cpu};
  if (write(out, values, sizeof values) != sizeof values) std::perror("write");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--host") o.host = value;
    else if (key == "--port") o.port = std::atoi(value.c_str());
    else if (key == "--path") o.path = value;
    else if (key == "--op") o.op = value;
    else if (key == "--tag") o.tag = value;
    else if (key == "--mode") o.mode = value;
    else if (key == "--clients") o.clients = std::atoi(value.c_str());
    else if (key == "--processes") o.processes = std::atoi(value.c_str());
    else if (key == "--size") o.size = std::atol(value.c_str());
    else if (key == "--warmup") o.warmup = std::atof(value.c_str());
    else if (key == "--duration") o.duration = std::atof(value.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  if (o.op != "stat" && o.op != "get" && o.op != "put") {
    std::fprintf(stderr, "--op must be stat, get or put\n");
    std::exit(2);
  }
  if (o.processes < 1) o.processes = 1;
  if (o.processes > o.clients) o.processes = o.clients;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  // thread start and logins before the clock: about 1 ms per client on a busy host
  double start_at = now() + 1.0 + o.clients / 1000.0 / o.processes;
  int pipes[2];
  if (pipe(pipes) != 0) return 1;
  std::vector<pid_t> children;
  for (int p = 0; p < o.processes; ++p) {
    pid_t pid = fork();
    if (pid == 0) {  // before XrdCl starts: each child has its own client library
      close(pipes[0]);
      if (o.mode == "async" && o.op == "stat")
        run_share_async(o, p, o.processes, start_at, pipes[1]);
      else
        run_share(o, p, o.processes, start_at, pipes[1]);
      std::fflush(nullptr);
      _exit(0);
    }
    children.push_back(pid);
  }
  close(pipes[1]);
  double ok = 0, failed = 0, bytes = 0, cpu = 0, rss = 0;
  for (pid_t pid : children) {
    int status = 0;
    struct rusage usage {};
    wait4(pid, &status, 0, &usage);
    rss += usage.ru_maxrss / 1024.0;
  }
  double values[4];
  while (read(pipes[0], values, sizeof values) == sizeof values) {
    ok += values[0];
    failed += values[1];
    bytes += values[2];
    cpu += values[3];
  }
  std::printf(
      "{\"clients\": %d, \"processes\": %d, \"op\": \"%s\", \"succeeded\": %.0f, "
      "\"failed\": %.0f, \"rate_hz\": %.1f, \"mb_s\": %.1f, \"cpu_s\": %.2f, "
      "\"rss_mb\": %.1f}\n",
      o.clients, o.processes, o.op.c_str(), ok, failed, ok / o.duration,
      bytes / o.duration / 1e6, cpu, rss);
  return 0;
}
