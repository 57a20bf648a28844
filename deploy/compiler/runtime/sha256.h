// SHA-256 (FIPS 180-4) for op bundles: the shim checks module.so against the digest it was built
// with, and deploy-run checks every file of SHA256SUMS, on devices that have no sha256sum.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <string>

namespace deploy {

class Sha256 {
 public:
  void Update(const unsigned char* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      block_[used_++] = data[i];
      if (used_ == 64) Compress();
    }
    bits_ += static_cast<uint64_t>(size) * 8;
  }

  // Pad, process the last block(s) and return the digest as 64 lowercase hex digits.
  std::string HexDigest() {
    uint64_t bits = bits_;
    const unsigned char one = 0x80, zero = 0;
    Update(&one, 1);
    while (used_ != 56) Update(&zero, 1);
    for (int shift = 56; shift >= 0; shift -= 8) {
      block_[used_++] = static_cast<unsigned char>(bits >> shift);
    }
    Compress();
    std::string hex;
    for (uint32_t word : state_) {
      char text[9];
      std::snprintf(text, sizeof(text), "%08x", word);
      hex += text;
    }
    return hex;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void Compress() {
    static constexpr uint32_t kRound[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = static_cast<uint32_t>(block_[4 * i]) << 24 | static_cast<uint32_t>(block_[4 * i + 1]) << 16 |
             static_cast<uint32_t>(block_[4 * i + 2]) << 8 | block_[4 * i + 3];
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::array<uint32_t, 8> v = state_;  // a..h
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = v[7] + (Rotr(v[4], 6) ^ Rotr(v[4], 11) ^ Rotr(v[4], 25)) +
                    ((v[4] & v[5]) ^ (~v[4] & v[6])) + kRound[i] + w[i];
      uint32_t t2 = (Rotr(v[0], 2) ^ Rotr(v[0], 13) ^ Rotr(v[0], 22)) +
                    ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
      v = {t1 + t2, v[0], v[1], v[2], v[3] + t1, v[4], v[5], v[6]};
    }
    for (int i = 0; i < 8; ++i) state_[i] += v[i];
    used_ = 0;
  }

  std::array<uint32_t, 8> state_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char block_[64] = {};
  size_t used_ = 0;
  uint64_t bits_ = 0;
};

// The digest of a regular file's bytes, or "" when it cannot be read or is no regular file: a
// FIFO put in a bundle would block the reader forever, /dev/zero would feed it forever. Looked
// at before it is opened (opening a device may do something), and opened without blocking.
inline std::string Sha256File(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return "";
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {  // replaced in between
    ::close(fd);
    return "";
  }
  Sha256 hash;
  unsigned char buffer[1 << 16];
  ssize_t got;
  while ((got = ::read(fd, buffer, sizeof(buffer))) != 0) {
    if (got > 0) hash.Update(buffer, static_cast<size_t>(got));
    else if (errno != EINTR) break;
  }
  ::close(fd);
  return got < 0 ? "" : hash.HexDigest();
}

}  // namespace deploy
