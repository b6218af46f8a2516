#include "server/disconnect_monitor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace reprise {

namespace {

// One "ADDR:PORT" field of /proc/net/tcp{,6}: the address is the raw
// network-order bytes printed as native-endian 32-bit hex words.
bool parse_proc_endpoint(const std::string& field, std::string& host, int& port) {
  const auto colon = field.find(':');
  if (colon == std::string::npos || (colon != 8 && colon != 32)) return false;
  uint32_t words[4] = {};
  for (size_t w = 0; w < colon / 8; ++w) {
    char* end = nullptr;
    const std::string hex = field.substr(w * 8, 8);
    words[w] = static_cast<uint32_t>(std::strtoul(hex.c_str(), &end, 16));
    if (*end != '\0') return false;
  }
  char* end = nullptr;
  port = static_cast<int>(std::strtol(field.c_str() + colon + 1, &end, 16));
  if (*end != '\0') return false;
  char buf[INET6_ADDRSTRLEN];
  const int family = colon == 8 ? AF_INET : AF_INET6;
  if (!inet_ntop(family, words, buf, sizeof buf)) return false;
  host = buf;
  return true;
}

bool same_host(const std::string& a, const std::string& b) {
  if (a == b) return true;
  // IPv4-mapped IPv6 on a dual-stack socket; a link-local address's
  // "%interface" (getnameinfo adds it, the kernel's tables do not).
  auto strip = [](std::string s) {
    if (s.rfind("::ffff:", 0) == 0 && s.find('.') != std::string::npos) s = s.substr(7);
    if (const auto pct = s.find('%'); pct != std::string::npos) s.resize(pct);
    return s;
  };
  return strip(a) == strip(b);
}

std::optional<uint64_t> find_socket_inode(const char* table, const std::string& local_addr, int local_port,
                                          const std::string& remote_addr, int remote_port) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // column titles
  while (std::getline(in, line)) {
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    uint64_t inode = 0;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode))
      continue;
    std::string local_host, remote_host;
    int lport = -1, rport = -1;
    if (!parse_proc_endpoint(local, local_host, lport) || !parse_proc_endpoint(remote, remote_host, rport)) continue;
    if (lport == local_port && rport == remote_port && inode != 0 && same_host(local_host, local_addr) &&
        same_host(remote_host, remote_addr))
      return inode;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> find_connection_socket(const std::string& local_addr, int local_port,
                                          const std::string& remote_addr, int remote_port) {
  // Endpoints -> socket inode from the kernel's connection tables, then inode
  // -> descriptor from /proc/self/fd's link names. Neither step touches other
  // descriptors (which other threads may be closing or reusing meanwhile).
  // The tables are read in pieces, and a piece can skip entries while other
  // connections open and close: look twice before giving up.
  std::optional<uint64_t> inode;
  for (int attempt = 0; attempt < 2 && !inode; ++attempt)
    for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
      inode = find_socket_inode(table, local_addr, local_port, remote_addr, remote_port);
      if (inode) break;
    }
  if (!inode) return std::nullopt;
  const std::string wanted = "socket:[" + std::to_string(*inode) + "]";
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return std::nullopt;
  std::optional<int> found;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0') continue;
    const std::string link = "/proc/self/fd/" + std::string(ent->d_name);
    char target[64];
    const ssize_t n = readlink(link.c_str(), target, sizeof target);
    if (n > 0 && static_cast<size_t>(n) == wanted.size() && wanted.compare(0, wanted.size(), target, n) == 0) {
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
