// idem/detail/my/session_life.hpp: what every session idem opens on MySQL / MariaDB does when it
// starts and after it lost an answer, shared by mysql_store and the global guard's sessions
// (detail/global/my_session.hpp):
//
//   set_up()            the session's settings (detail/my/sql.hpp, session_setup) in one round trip,
//                       returning the server's durability settings and the statement budget
//                       (max_allowed_packet less room for headers and separators)
//   take_life_lock()    a user lock of a random name, held until the session ends: it names the
//                       session on the server, exactly, for as long as it lives
//   end_lost_session()  after a round trip holding COMMIT lost its answer: the session holding
//                       that lock is killed and waited for, so its transaction is final (committed
//                       or rolled back) before anyone reads whether it committed
//
// Why the lock and not CONNECTION_ID(): after a server restart a new client may get the old id, and
// KILL would end someone else's session; a restart frees every user lock, so a held lock always
// names the session that took it. Why kill first: a server that was stopped (SIGSTOP, a pause of
// its host) may not have read the lost session's query yet, and would run it, COMMIT included,
// after a read that found the batch absent.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "idem/detail/my/connection.hpp"
#include "idem/detail/my/schema.hpp"
#include "idem/detail/my/sql.hpp"
#include "idem/detail/rows/text_decoder.hpp"

namespace idem::detail::my {

struct session_settings {
    durability d;
    std::size_t budget = 0;  ///< the longest query to send: max_allowed_packet less 1 KiB
};

/// Runs session_setup() with the server's waits bounded by `deadline`.
[[nodiscard]] inline session_settings set_up(session& s, std::chrono::milliseconds deadline) {
    session_settings out;
    std::uint64_t packet = 0;
    s.run(session_setup(whole_seconds(deadline)), [&](int statement, row_view r) {
        if (statement != session_setup_settings_statement) return;
        out.d.flush_log_at_trx_commit = std::string(r[0]);
        out.d.log_bin = r[1] == "1" || r[1] == "ON";
        out.d.sync_binlog = std::string(r[2]);
        (void)rows::parse_uint64_bits(r[3], packet);
    });
    out.budget = static_cast<std::size_t>(std::max<std::uint64_t>(packet, 64 * 1024) - 1024);
    return out;
}

/// Takes the session's life lock and returns its name ("" when the server did not grant it: the
/// caller refuses the session, whose lost answers could not be resolved exactly).
[[nodiscard]] inline std::string take_life_lock(session& s) {
    std::random_device rd;
    char name[40];
    std::snprintf(name, sizeof name, "idem_session_%08x%08x", rd(), rd());  // hex digits: safe in SQL
    bool locked = false;
    s.run(std::string("SELECT GET_LOCK('") + name + "', 0)", [&](int, row_view r) { locked = r[0] == "1"; });
    return locked ? std::string(name) : std::string();
}

/// Ends the session holding `lock` (from `s`, another session): KILL CONNECTION until the lock is
/// free, polling every 5 ms, for at most `deadline`. True once it is free (the old transaction is
/// final); false when the session was still running at the deadline (ask again later).
[[nodiscard]] inline bool end_lost_session(session& s, const std::string& lock, std::chrono::milliseconds deadline,
                                           std::string* holder_out = nullptr) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
        std::string holder;
        s.run("SELECT IS_USED_LOCK('" + lock + "')", [&](int, row_view r) {
            if (r[0].data() != nullptr) holder.assign(r[0]);
        });
        if (holder.empty()) return true;  // the session is gone: its transaction is final
        if (holder_out != nullptr) *holder_out = holder;
        try {
            s.run("KILL CONNECTION " + holder);
        } catch (const failure& f) {
            if (f.code != ER_NO_SUCH_THREAD) throw;  // ended meanwhile
        }
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a bounded poll for its end
    }
}

}  // namespace idem::detail::my
