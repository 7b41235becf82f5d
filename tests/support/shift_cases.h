// Communicator::ShiftV's and AllToAllAsync's cases, run on every rank of any backend (the loopback test runs the default,
// one Shift per piece; the MPI test MpiCommunicator's, one size check for all pieces): per-rank piece
// counts and sizes, empty pieces, ranks with nothing to move, every distance; pieces whose total agrees
// but whose sizes do not, and a missing piece, refused on every rank before anything moves.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zrt/core/communicator.h"

namespace zrt::testing {

inline Status ShiftVCases(Communicator& c) {
  const int n = c.size(), r = c.rank();
  // Rank q sends q % 3 + 1 pieces (the last empty when q is odd) of 100 q + 10 i + 1 bytes; with more
  // than two ranks the last one moves nothing (empty lists on both sides of its pairs).
  auto pieces = [n](int sender, int receiver) {
    std::vector<size_t> v;
    if (n > 2 && (sender == n - 1 || receiver == n - 1)) return v;
    for (int i = 0; i <= sender % 3; ++i) v.push_back(sender % 2 == 1 && i == sender % 3 ? 0 : static_cast<size_t>(100 * sender + 10 * i + 1));
    return v;
  };
  for (int d : {1, -1, 0, n + 1}) {
    const int to = ((r + d) % n + n) % n, from = ((r - d) % n + n) % n;
    std::vector<std::vector<char>> out, in;
    for (size_t b : pieces(r, to)) out.emplace_back(b, static_cast<char>(r * 7 + static_cast<int>(out.size())));
    for (size_t b : pieces(from, r)) in.emplace_back(b, static_cast<char>(-1));
    std::vector<Communicator::ShiftSend> send;
    std::vector<Communicator::ShiftRecv> recv;
    for (auto& o : out) send.push_back({o.data(), o.size()});
    for (auto& i : in) recv.push_back({i.data(), i.size()});
    RETURN_IF_ERROR(c.ShiftV(send, recv, d), "distance ", d);
    for (size_t i = 0; i < in.size(); ++i) {
      for (char x : in[i]) EXPECT_EQ(x, static_cast<char>(from * 7 + static_cast<int>(i))) << "distance " << d << " piece " << i;
    }
  }
  if (n > 1) {
    // The same 30 bytes, cut differently on rank 0's side; then a piece missing on rank 0's side:
    // refused on every rank, and nothing arrives (not even the pieces that agree).
    std::vector<char> buf(30, 0), out(30, 5);
    std::vector<Communicator::ShiftSend> send = {{out.data(), 10}, {out.data() + 10, 20}};
    std::vector<Communicator::ShiftRecv> recv = {{buf.data(), r == 0 ? size_t{20} : size_t{10}}, {buf.data() + 20, r == 0 ? size_t{10} : size_t{20}}};
    Status s = c.ShiftV(send, recv, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << s;
    if (r == 0) recv.pop_back(), recv[0].bytes = 10;
    if (r != 0) recv = {{buf.data(), 10}, {buf.data() + 10, 20}};
    s = c.ShiftV(send, recv, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << s;
    for (char x : buf) EXPECT_EQ(x, 0) << "rank " << r << ": a refused shift moved bytes";
  }
  return Status();
}

// Communicator::AllToAllAsync on every rank: block r of rank q's send is q * 31 + r + i at byte i,
// and rank r receives it as its block q; odd block sizes, a zero-size one, overlapped with an
// all-reduce.
inline Status AllToAllCases(Communicator& c) {
  const int n = c.size(), r = c.rank();
  for (size_t bytes : {size_t{1}, size_t{13}, size_t{4096 + 5}, size_t{0}}) {
    std::vector<char> out(bytes * static_cast<size_t>(n)), in(bytes * static_cast<size_t>(n), -1);
    for (int to = 0; to < n; ++to) {
      for (size_t i = 0; i < bytes; ++i) out[bytes * static_cast<size_t>(to) + i] = static_cast<char>(r * 31 + to + static_cast<int>(i));
    }
    ASSIGN_OR_RETURN(CommHandle h, c.AllToAllAsync(out.data(), in.data(), bytes));
    float v = 1;
    RETURN_IF_ERROR(c.AllReduce(&v, &v, 1, DType::kF32, ReduceOp::kSum));
    RETURN_IF_ERROR(h.Wait());
    for (int from = 0; from < n; ++from) {
      for (size_t i = 0; i < bytes; ++i) {
        EXPECT_EQ(in[bytes * static_cast<size_t>(from) + i], static_cast<char>(from * 31 + r + static_cast<int>(i)))
            << "block from rank " << from << " byte " << i << " of " << bytes;
      }
    }
  }
  return Status();
}

}  // namespace zrt::testing
