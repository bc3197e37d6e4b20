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
// Built on first use (pytest_storagescale/drivers/native/__init__.py):
//   g++ -O2 -std=c++17 -shared -fPIC -I/usr/include/xrootd xrdloop.cc -lXrdCl
#include <XrdCl/XrdClFile.hh>
#include <XrdCl/XrdClFileSystem.hh>
#include <XrdCl/XrdClURL.hh>

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

double monotonic() {  // Python's time.perf_counter() on Linux
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

struct Client {
  std::string server;  // root://<login>@host:port
  XrdCl::FileSystem fs;
  std::vector<std::string> paths;
  std::vector<char> buffer;
  explicit Client(const char* url) : server(url), fs{XrdCl::URL(url)} {}
};

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

// stat: 0 bytes moved
bool stat_once(Client& c, const std::string& path, uint16_t timeout, long long* moved,
               int* code, int* err, int* level, char* message, int size) {
  XrdCl::StatInfo* info = nullptr;
  XrdCl::XRootDStatus status = c.fs.Stat(path, info, timeout);
  delete info;
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
  XrdCl::XRootDStatus status =
      file.Open(c.server + "/" + path, XrdCl::OpenFlags::Read, XrdCl::Access::None,
                timeout);
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

void ss_client_free(void* client) { delete static_cast<Client*>(client); }

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
  const long long files = static_cast<long long>(c.paths.size());
  int done = 0;
  while (done < n && !*stop) {
    double began = monotonic();
    if (done > 0 && began > until) break;
    const std::string& path = c.paths[((first + done * step) % files + files) % files];
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

}  // extern "C"
