#include "server/disconnect_monitor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
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

// A host without a link-local address's "%interface" (getnameinfo adds it;
// the kernel's tables and sock_diag do not know it).
std::string without_zone(std::string host) {
  if (const auto pct = host.find('%'); pct != std::string::npos) host.resize(pct);
  return host;
}

bool same_host(const std::string& a, const std::string& b) {
  if (a == b) return true;
  // IPv4-mapped IPv6 on a dual-stack socket.
  auto strip = [](std::string s) {
    if (s.rfind("::ffff:", 0) == 0 && s.find('.') != std::string::npos) s = s.substr(7);
    return without_zone(std::move(s));
  };
  return strip(a) == strip(b);
}

std::optional<uint64_t> inode_from_table(const char* table, const std::string& local_addr, int local_port,
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

// A numeric IPv4 or IPv6 host (IPv4 as a v4-mapped IPv6 address when
// `family` is AF_INET6), in network byte order.
bool parse_host(const std::string& host, int family, uint32_t (&words)[4]) {
  const std::string h = without_zone(host);
  std::memset(words, 0, sizeof words);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    if (family == AF_INET) {
      std::memcpy(words, &v4, 4);
    } else {
      const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      std::memcpy(words, mapped, 12);
      std::memcpy(reinterpret_cast<uint8_t*>(words) + 12, &v4, 4);
    }
    return true;
  }
  in6_addr v6{};
  if (family == AF_INET6 && inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    std::memcpy(words, &v6, 16);
    return true;
  }
  return false;
}

// One exact-endpoint query for one address family; nullopt if the kernel
// has no such socket or the query cannot be made.
std::optional<uint64_t> inode_from_netlink(int family, const std::string& local_addr, int local_port,
                                           const std::string& remote_addr, int remote_port) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  if (local_port <= 0 || local_port > 65535 || remote_port <= 0 || remote_port > 65535) return std::nullopt;
  if (!parse_host(local_addr, family, message.request.id.idiag_src) ||
      !parse_host(remote_addr, family, message.request.id.idiag_dst))
    return std::nullopt;
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;  // one socket, not a dump
  message.request.sdiag_family = static_cast<uint8_t>(family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0u;
  message.request.id.idiag_sport = htons(static_cast<uint16_t>(local_port));
  message.request.id.idiag_dport = htons(static_cast<uint16_t>(remote_port));
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return std::nullopt;
  std::optional<uint64_t> inode;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  timeval timeout{1, 0};  // the kernel answers at once; never hang a request on it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (::sendto(fd, &message, sizeof message, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(sizeof message)) {
    alignas(nlmsghdr) char reply[1024];
    const ssize_t n = ::recv(fd, reply, sizeof reply, 0);
    const auto* h = reinterpret_cast<const nlmsghdr*>(reply);
    if (n >= static_cast<ssize_t>(sizeof(nlmsghdr)) && NLMSG_OK(h, static_cast<size_t>(n)) &&
        h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      // The kernel's lookup falls back to a listening socket on the local
      // port: only a socket with exactly the asked endpoints will do.
      const auto* found = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      const inet_diag_sockid& want = message.request.id;
      const size_t addr_bytes = family == AF_INET ? 4 : 16;
      const bool same = found->id.idiag_sport == want.idiag_sport && found->id.idiag_dport == want.idiag_dport &&
                        std::memcmp(found->id.idiag_src, want.idiag_src, addr_bytes) == 0 &&
                        std::memcmp(found->id.idiag_dst, want.idiag_dst, addr_bytes) == 0;
      constexpr uint8_t kTcpListen = 10;
      if (same && found->idiag_state != kTcpListen && found->idiag_inode != 0) inode = found->idiag_inode;
    }
  }
  ::close(fd);
  return inode;
}

}  // namespace

std::optional<uint64_t> socket_inode_from_netlink(const std::string& local_addr, int local_port,
                                                  const std::string& remote_addr, int remote_port) {
  for (int family : {AF_INET, AF_INET6})
    if (auto inode = inode_from_netlink(family, local_addr, local_port, remote_addr, remote_port)) return inode;
  return std::nullopt;
}

std::optional<uint64_t> socket_inode_from_proc(const std::string& local_addr, int local_port,
                                               const std::string& remote_addr, int remote_port) {
  // The tables are read in pieces, and a piece can skip entries while other
  // connections open and close: look twice before giving up.
  for (int attempt = 0; attempt < 2; ++attempt)
    for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"})
      if (auto inode = inode_from_table(table, local_addr, local_port, remote_addr, remote_port)) return inode;
  return std::nullopt;
}

std::optional<int> find_connection_socket(const std::string& local_addr, int local_port,
                                          const std::string& remote_addr, int remote_port) {
  // Endpoints -> socket inode (one exact netlink query; the kernel's text
  // tables where netlink is unavailable), then inode -> descriptor from
  // /proc/self/fd's link names. Neither step touches other descriptors
  // (which other threads may be closing or reusing meanwhile).
  std::optional<uint64_t> inode = socket_inode_from_netlink(local_addr, local_port, remote_addr, remote_port);
  if (!inode) inode = socket_inode_from_proc(local_addr, local_port, remote_addr, remote_port);
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
