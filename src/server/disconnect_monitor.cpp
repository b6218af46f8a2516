#include "server/disconnect_monitor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace reprise {

namespace {

// host/port of a socket address, numeric, as cpp-httplib formats them.
bool endpoint_of(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  host = buf;
  if (addr.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  else if (addr.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  else return false;
  return true;
}

bool same_host(const std::string& a, const std::string& b) {
  if (a == b) return true;
  // IPv4-mapped IPv6 on a dual-stack socket.
  auto strip = [](const std::string& s) { return s.rfind("::ffff:", 0) == 0 ? s.substr(7) : s; };
  return strip(a) == strip(b);
}

}  // namespace

std::optional<int> find_connection_socket(const std::string& local_addr, int local_port,
                                          const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return std::nullopt;
  std::optional<int> found;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t peer_len = sizeof peer, self_len = sizeof self;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;
    std::string peer_host, self_host;
    int peer_port = -1, self_port = -1;
    if (!endpoint_of(peer, peer_len, peer_host, peer_port) || !endpoint_of(self, self_len, self_host, self_port))
      continue;
    if (peer_port == remote_port && self_port == local_port && same_host(peer_host, remote_addr) &&
        same_host(self_host, local_addr)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

DisconnectMonitor::Watch& DisconnectMonitor::Watch::operator=(Watch&& other) noexcept {
  if (this != &other) {
    reset();
    monitor_ = std::exchange(other.monitor_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void DisconnectMonitor::Watch::reset() {
  if (monitor_) std::exchange(monitor_, nullptr)->unwatch(id_);
}

DisconnectMonitor::DisconnectMonitor(std::chrono::milliseconds interval) : interval_(interval) {
  thread_ = std::thread([this] { loop(); });
}

DisconnectMonitor::~DisconnectMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

DisconnectMonitor::Watch DisconnectMonitor::watch(int fd, std::function<void()> on_hangup) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  watches_.emplace(id, std::make_pair(fd, std::move(on_hangup)));
  changed_.notify_all();
  return Watch(this, id);
}

void DisconnectMonitor::unwatch(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  watches_.erase(id);
}

size_t DisconnectMonitor::watched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return watches_.size();
}

void DisconnectMonitor::loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (watches_.empty()) {
      changed_.wait(lock, [&] { return stopping_ || !watches_.empty(); });
      continue;
    }
    fds.clear();
    ids.clear();
    for (const auto& [id, watch] : watches_) {
      fds.push_back({watch.first, POLLRDHUP, 0});
      ids.push_back(id);
    }
    lock.unlock();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(interval_.count()));
    lock.lock();
    if (ready > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
        // Only if still watched: the descriptor may have been reused since.
        auto it = watches_.find(ids[i]);
        if (it == watches_.end()) continue;
        it->second.second();
        watches_.erase(it);
      }
    }
    // poll returns at once while a hung-up socket stays unwatched-but-open;
    // pace the loop so that cannot spin.
    if (ready > 0) changed_.wait_for(lock, interval_, [&] { return stopping_; });
  }
}

}  // namespace reprise
