// verify/fuzz/fuzz_ops.cpp: operation sequences against a single-threaded reference model.
//
// A guard on a manual clock (no background thread) runs a fuzzed sequence of begin / begin_many /
// succeed / fail / extend / drop / advance clock / set the resolver's answer / compensate / collect on eight
// keys, and a plain model (std::map per generation, written from the state machine of
// docs/design.md, not from the engine) predicts every answer: the begin status, outcome and fence
// (fences are exact: (epoch << 32) | 1 for a key's first claim in a generation, +1 after a release
// or a reclaim), every ticket result, compensation's count and the resolver's arguments, whether
// collect() rotates, query() of every key after every step, and the counters of snapshot(). A
// begin_many batch is predicted as the same begin() calls in order. A success carries a response
// payload of 0 to 47 bytes (NUL and non-UTF-8 bytes among them; options.max_payload is 40): the
// model predicts the bytes every duplicate and query() replays, and that a payload over the
// maximum is refused with invalid_argument, changing nothing (the ticket stays valid).
//
// The first byte picks the failure policy, whether reclaim_expired is on, and whether versions are
// ordered (options.ordered_versions): then the eight keys are versions 0 to 3 of two (txid,
// operation) identities, and the model keeps the newest version claimed per identity and generation
// (forgotten when its generation is recycled) and predicts superseded where a claim would be granted
// for an older version (docs/api.md, "ordered versions"). The table holds
// capacity 4 (8 slots per generation, probe bound 64), so eight keys never exhaust it and the model
// needs no hash, while two new keys in a generation already make it due for rotation, so records are
// evicted often: every difference is a finding.
#include <idem/guard.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::errc;
using idem::record_state;
using idem::resolution;
using guard_t = idem::basic_guard<std::atomic, idem::manual_clock>;
using ticket_t = idem::basic_ticket<std::atomic, idem::manual_clock>;

constexpr std::size_t keys = 8;
constexpr std::size_t capacity = 4;
constexpr auto lease = 1000ms;
constexpr auto retention = 2000ms;
constexpr std::size_t max_payload = 40;

/// The payload a success step records: its length and bytes come from one fuzzed byte and the step.
std::string payload_of(std::uint8_t b, std::size_t step) {
    std::string p(b % 48, '\0');
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>((b * 31 + step * 131 + i * 7) & 0xff);
    return p;
}

enum class mst { processing, succeeded, failed, released };

struct mrec {
    mst state = mst::processing;
    std::uint64_t fence = 0, outcome = 0, fingerprint = 0;
    bool doubt = false;
    std::int64_t lease_until = 0, updated = 0;
    std::string payload;  // the response bytes of the last completion (a success's; else none)
};

struct counters {
    std::uint64_t acquired = 0, duplicates = 0, in_progress = 0, mismatch = 0, succeeded = 0, failed = 0, released = 0,
                  stale = 0, in_doubt = 0, compensated = 0, reclaimed = 0, evicted = 0, rotations = 0, superseded = 0;
};

struct mticket {
    ticket_t t;
    std::size_t k;
    std::uint64_t fence;
    unsigned gen;      // parity of the generation whose slot holds the claim
    bool ran = false;  // a completion was refused: the drop leaves the claim in doubt, never released
};

struct reader {
    const std::uint8_t* p;
    std::size_t n;
    std::uint8_t byte() { return n ? (--n, *p++) : 0; }
};

[[noreturn]] void finding(const std::string& what) {
    std::fprintf(stderr, "fuzz_ops: model and guard disagree: %s\n", what.c_str());
    std::abort();
}
#define EXPECT(cond, what)                                                                          \
    do {                                                                                            \
        if (!(cond)) finding(std::string(what) + " [" #cond "] at step " + std::to_string(steps_)); \
    } while (0)

class model_run {
public:
    model_run(bool terminal, bool reclaim, bool ordered) : terminal_(terminal), reclaim_(reclaim), ordered_(ordered) {
        idem::options o;
        o.capacity = capacity;
        o.max_probe = 64;
        o.lease = lease;
        o.retention = retention;
        o.maintenance_interval = {};
        o.on_failure = terminal ? idem::failure_policy::terminal : idem::failure_policy::retryable;
        o.reclaim_expired = reclaim;
        o.ordered_versions = ordered;
        o.max_payload = max_payload;
        o.resolve = [this](const idem::expired_claim& c) { return resolve(c); };
        g_.emplace(std::move(o), clock_);
        for (std::size_t i = 0; i < keys; ++i)
            names_.push_back(ordered ? idem::key::compose("TX" + std::to_string(identity(i)), "PAY", version(i))
                                     : idem::key("TX" + std::to_string(i) + "_PAY_v1"));
    }
    ~model_run() {
        static const bool verbose = std::getenv("IDEM_FUZZ_VERBOSE") != nullptr;
        if (verbose)
            std::fprintf(stderr,
                         "steps %zu acquired %llu reclaimed %llu succeeded %llu failed %llu released %llu stale %llu "
                         "doubt %llu compensated %llu rotations %llu evicted %llu mismatch %llu\n",
                         steps_, (unsigned long long)c_.acquired, (unsigned long long)c_.reclaimed,
                         (unsigned long long)c_.succeeded, (unsigned long long)c_.failed, (unsigned long long)c_.released,
                         (unsigned long long)c_.stale, (unsigned long long)c_.in_doubt, (unsigned long long)c_.compensated,
                         (unsigned long long)c_.rotations, (unsigned long long)c_.evicted, (unsigned long long)c_.mismatch);
        tickets_.clear();  // destructors release through the guard, which must still exist
        g_.reset();
    }

    void step(reader& r) {
        ++steps_;
        const std::uint8_t op = r.byte() % 10;
        switch (op) {
            case 0: begin(r.byte() % keys, r.byte()); break;
            case 1:
                with_ticket(r, [&](std::size_t i) {
                    const std::uint8_t outcome = r.byte();
                    complete(i, mst::succeeded, outcome, false, payload_of(r.byte(), steps_));
                });
                break;
            case 2:
                with_ticket(r, [&](std::size_t i) {
                    const std::uint8_t b = r.byte();
                    // An explicit terminal failure with bit 2 set carries an error response.
                    const bool response = (b & 1) && (b & 2) && (b & 4);
                    complete(i, b & 1 ? mst::failed : mst::released, b >> 1, !(b & 2),
                             response ? payload_of(b, steps_) : std::string());
                });
                break;
            case 3:
                with_ticket(r, [&](std::size_t i) { extend(i, std::chrono::milliseconds(250 * (r.byte() % 8))); });
                break;
            case 4: with_ticket(r, [&](std::size_t i) { drop(i); }); break;
            case 5: advance(std::chrono::milliseconds(250 * (r.byte() % 8))); break;
            case 6: {
                const std::size_t k = r.byte() % keys;
                verdict_[k] = static_cast<resolution>(r.byte() % 4);
                verdict_outcome_[k] = r.byte();
                break;
            }
            case 7: compensate(); break;
            case 8: collect(); break;
            default: begin_many(r); break;
        }
        check_all();
    }

private:
    // ---- model helpers --------------------------------------------------------------------------
    std::map<std::size_t, mrec>& cur() { return gen_[epoch_ & 1]; }
    std::map<std::size_t, mrec>& prev() { return gen_[(epoch_ + 1) & 1]; }
    std::int64_t now() const { return clock_.now().count(); }
    bool expired(const mrec& m) const { return m.lease_until <= now(); }

    /// What begin() answers for an existing record (engine::existing).
    begin_status existing(const mrec& m, std::uint64_t fp, std::uint64_t& outcome, std::string& payload) {
        outcome = 0;
        payload.clear();
        if (fp != 0 && m.fingerprint != 0 && fp != m.fingerprint) {
            ++c_.mismatch;
            return begin_status::payload_mismatch;
        }
        if (m.state == mst::succeeded || m.state == mst::failed) {
            ++c_.duplicates;
            outcome = m.outcome;
            payload = m.payload;
            return m.state == mst::succeeded ? begin_status::succeeded : begin_status::failed;
        }
        ++c_.in_progress;
        return m.doubt ? begin_status::in_doubt : begin_status::in_progress;
    }

    void claim(mrec& m, std::uint64_t fence, std::uint64_t fp) {
        m.state = mst::processing;
        m.fence = fence;
        m.fingerprint = fp;
        m.doubt = false;
        m.lease_until = now() + std::chrono::nanoseconds(lease).count();
        m.updated = now();
        // the outcome field keeps its old value: a claim does not write it
    }

    // Ordered versions: key i is version i / 2 of identity i % 2.
    static std::size_t identity(std::size_t k) { return k % 2; }
    static std::uint32_t version(std::size_t k) { return static_cast<std::uint32_t>(k / 2); }

    /// The version step of a claim of key k that would be granted: the newest version of its
    /// identity in the current or previous generation, if newer (superseded), else nullopt and the
    /// current generation now holds version(k) at least.
    std::optional<std::uint32_t> superseded_by(std::size_t k) {
        if (!ordered_) return std::nullopt;
        const std::size_t id = identity(k);
        std::optional<std::uint32_t> newest;
        for (auto* vm : {&versions_[epoch_ & 1], &versions_[(epoch_ + 1) & 1]})
            if (auto it = vm->find(id); it != vm->end()) newest = std::max(newest.value_or(0), it->second);
        if (newest && *newest > version(k)) {
            ++c_.superseded;
            return newest;
        }
        auto& cur_v = versions_[epoch_ & 1][id];
        cur_v = std::max(cur_v, version(k));
        return std::nullopt;
    }

    // ---- operations ---------------------------------------------------------------------------
    static std::uint64_t fingerprint_of(std::uint8_t b) { return b % 3 == 0 ? 0 : 1000 + b % 3; }

    void begin(std::size_t k, std::uint8_t b) {
        const std::uint64_t fp = fingerprint_of(b);
        auto r = g_->begin(names_[k], fp);
        check_begin(r, k, predict(k, fp));
    }

    /// begin_many() of 1 to 6 keys (repeats are likely among eight): the model predicts the batch
    /// as that many begin() calls in order, with nothing between them.
    void begin_many(reader& rd) {
        const std::size_t n = 1 + rd.byte() % 6;
        std::vector<idem::key> batch;
        std::vector<std::size_t> ks;
        std::vector<std::uint64_t> fps;
        for (std::size_t i = 0; i < n; ++i) {
            ks.push_back(rd.byte() % keys);
            fps.push_back(fingerprint_of(rd.byte()));
            batch.push_back(names_[ks.back()]);
        }
        std::vector<guard_t::result_type> out(n);
        EXPECT(g_->begin_many(batch, out, fps) == n, "begin_many answers every key");
        std::vector<predicted> want;
        for (std::size_t i = 0; i < n; ++i) want.push_back(predict(ks[i], fps[i]));
        for (std::size_t i = 0; i < n; ++i) check_begin(out[i], ks[i], want[i]);
    }

    struct predicted {
        begin_status want;
        std::uint64_t outcome, fence;
        unsigned where;  // the generation whose slot holds the claim
        std::string payload;
    };

    /// What the model says begin(k, fp) answers now, and its effect on the model.
    predicted predict(std::size_t k, std::uint64_t fp) {
        begin_status want;
        std::uint64_t outcome = 0, fence = 0;
        std::string payload;
        unsigned where = epoch_ & 1;
        auto c = cur().find(k);
        const bool grants = (c != cur().end() && c->second.state == mst::released) ||
                            (c != cur().end() && c->second.state == mst::processing && reclaim_ && expired(c->second));
        if (grants) {
            if (auto newest = superseded_by(k)) return {begin_status::superseded, *newest, 0, where};
        }
        if (c != cur().end() && c->second.state == mst::released) {
            fence = c->second.fence + 1;
            claim(c->second, fence, fp);
            want = begin_status::acquired;
            ++c_.acquired;
        } else if (c != cur().end() && c->second.state == mst::processing && reclaim_ && expired(c->second)) {
            fence = c->second.fence + 1;
            claim(c->second, fence, fp);
            want = begin_status::acquired;
            ++c_.reclaimed;
        } else if (c != cur().end()) {
            fence = c->second.fence;
            want = existing(c->second, fp, outcome, payload);
        } else {
            fence = (epoch_ << 32) | 1;
            auto p = prev().find(k);
            bool claimable = true;
            if (p != prev().end()) {
                if (p->second.state == mst::released) {
                    fence = p->second.fence + 1;
                } else {
                    claimable = false;
                    fence = p->second.fence;
                    want = existing(p->second, fp, outcome, payload);
                }
            }
            if (claimable) {
                if (auto newest = superseded_by(k)) return {begin_status::superseded, *newest, 0, where};
                mrec m;
                claim(m, fence, fp);
                cur()[k] = m;
                ++fill_[epoch_ & 1];
                want = begin_status::acquired;
                ++c_.acquired;
            } else {
                where = (epoch_ + 1) & 1;
            }
        }
        return {want, outcome, fence, where, payload};
    }

    /// Compares the guard's answer r for key k with the model's; keeps an acquired claim's ticket.
    void check_begin(guard_t::result_type& r, std::size_t k, const predicted& p) {
        EXPECT(r.status == p.want, "begin status: guard " + std::string(idem::to_string(r.status)) + ", model " +
                                       idem::to_string(p.want) + " for key " + std::to_string(k));
        EXPECT(r.fence == p.fence, "begin fence");
        if (p.want == begin_status::acquired) {
            EXPECT(r.ticket.valid() && r.ticket.fence() == p.fence, "ticket of an acquired begin");
            EXPECT(p.fence > max_fence_[k], "fences strictly increase per key");
            max_fence_[k] = p.fence;
            if (tickets_.size() == 4) drop(0);
            tickets_.push_back(mticket{std::move(r.ticket), k, p.fence, p.where});
        } else {
            EXPECT(!r.ticket.valid(), "a ticket without a claim");
            EXPECT(r.outcome == p.outcome, "replayed outcome: guard " + std::to_string(r.outcome) + ", model " +
                                               std::to_string(p.outcome) + " (" + idem::to_string(p.want) + ") for key " +
                                               std::to_string(k));
            EXPECT(r.payload == p.payload, "replayed payload of key " + std::to_string(k));
        }
    }

    template <class Fn>
    void with_ticket(reader& r, Fn&& fn) {
        const std::uint8_t b = r.byte();
        if (tickets_.empty()) return;
        fn(b % tickets_.size());
    }

    /// The record the ticket's slot holds, if the claim is still that ticket's.
    mrec* owned(const mticket& t) {
        auto& gen = gen_[t.gen];
        auto it = gen.find(t.k);
        if (it == gen.end() || it->second.state != mst::processing || it->second.fence != t.fence) return nullptr;
        return &it->second;
    }

    void finish_model(mrec& m, mst to, std::uint64_t outcome, std::string payload = {}) {
        m.state = to;
        m.outcome = outcome;
        m.payload = std::move(payload);
        m.updated = now();
        m.doubt = false;
        (to == mst::succeeded ? c_.succeeded : to == mst::failed ? c_.failed : c_.released)++;
    }

    void complete(std::size_t i, mst to, std::uint64_t outcome, bool default_policy, const std::string& payload = {}) {
        mticket& t = tickets_[i];
        if (!t.t.valid()) {
            EXPECT(t.t.succeed(1) == errc::empty_ticket, "an empty ticket says so");
            EXPECT(t.t.succeed(1, payload) == errc::empty_ticket, "an empty ticket says so, with a payload");
            return;
        }
        if (payload.size() > max_payload) {
            // Refused before anything is looked at: nothing changes, stale or not.
            const std::error_code refused = to == mst::succeeded
                                                ? t.t.succeed(outcome, payload)
                                                : t.t.fail(outcome, idem::failure_policy::terminal, payload);
            EXPECT(refused == errc::invalid_argument, "a payload over max_payload is refused");
            EXPECT(t.t.valid(), "a refused payload leaves the ticket valid");
            t.ran = true;
            return;
        }
        if (default_policy && to != mst::succeeded) to = terminal_ ? mst::failed : mst::released;
        mrec* m = owned(t);
        std::error_code ec;
        if (to == mst::succeeded)
            ec = payload.empty() && (outcome & 1) ? t.t.succeed(outcome) : t.t.succeed(outcome, payload);
        else if (default_policy) ec = t.t.fail(outcome);
        else if (to == mst::failed && !payload.empty()) ec = t.t.fail(outcome, idem::failure_policy::terminal, payload);
        else ec = t.t.fail(outcome, to == mst::failed ? idem::failure_policy::terminal : idem::failure_policy::retryable);
        if (m) {
            EXPECT(!ec, "completion of a current ticket: " + ec.message());
            finish_model(*m, to, outcome, to != mst::released ? payload : std::string());
        } else {
            EXPECT(ec == errc::stale_ticket, "completion of a stale ticket: " + ec.message());
            ++c_.stale;
        }
        EXPECT(!t.t.valid(), "a completed ticket is empty");
        EXPECT(t.t.succeed(1) == errc::empty_ticket && t.t.extend(lease) == errc::empty_ticket,
               "a completed ticket says it is empty");
        tickets_.erase(tickets_.begin() + static_cast<std::ptrdiff_t>(i));
    }

    void extend(std::size_t i, std::chrono::nanoseconds by) {
        mticket& t = tickets_[i];
        if (!t.t.valid()) {
            EXPECT(t.t.extend(by) == errc::empty_ticket, "extend on an empty ticket");
            return;
        }
        mrec* m = owned(t);
        const std::error_code ec = t.t.extend(by);
        if (m) {
            EXPECT(!ec, "extend of a current ticket");
            m->lease_until = now() + by.count();
            m->doubt = false;
            EXPECT(t.t.valid(), "an extended ticket stays valid");
        } else {
            EXPECT(ec == errc::stale_ticket, "extend of a stale ticket");
            ++c_.stale;
            EXPECT(!t.t.valid(), "a stale ticket becomes empty");
        }
    }

    void drop(std::size_t i) {
        mticket& t = tickets_[i];
        if (t.t.valid()) {
            if (mrec* m = owned(t)) {
                if (t.ran) {  // the caller said the effect happened: in doubt for the resolver
                    if (!m->doubt) {
                        m->doubt = true;
                        ++c_.in_doubt;
                    }
                } else {
                    finish_model(*m, terminal_ ? mst::failed : mst::released, 0);
                }
            } else {
                ++c_.stale;
            }
        }
        tickets_.erase(tickets_.begin() + static_cast<std::ptrdiff_t>(i));  // the destructor releases
    }

    void advance(std::chrono::nanoseconds d) { clock_.advance(d); }

    idem::resolver_answer resolve(const idem::expired_claim& c) {
        // The resolver is asked only about expired processing claims, with their fence and fingerprint.
        std::size_t k = keys;
        for (std::size_t i = 0; i < keys; ++i)
            if (names_[i].view() == c.key) k = i;
        EXPECT(k < keys, "resolver asked about an unknown key");
        const mrec* m = nullptr;
        for (auto& gen : gen_)
            if (auto it = gen.find(k); it != gen.end() && it->second.state == mst::processing) m = &it->second;
        EXPECT(m != nullptr && expired(*m), "resolver asked about a claim that is not an expired one");
        EXPECT(c.fence == m->fence && c.fingerprint == m->fingerprint, "resolver told the claim's fence and fingerprint");
        asked_.push_back(k);
        return {verdict_[k], verdict_outcome_[k]};
    }

    void compensate() {
        asked_.clear();
        const std::size_t resolved = g_->compensate();
        std::size_t want = 0;
        std::vector<std::size_t> want_asked;
        for (auto& gen : gen_) {
            for (auto& [k, m] : gen) {
                if (m.state != mst::processing || !expired(m)) continue;
                want_asked.push_back(k);
                const resolution v = verdict_[k];
                if (v == resolution::unknown) {
                    if (!m.doubt) {
                        m.doubt = true;
                        ++c_.in_doubt;
                    }
                    continue;
                }
                finish_model(m,
                             v == resolution::succeeded ? mst::succeeded
                             : v == resolution::failed  ? mst::failed
                                                        : mst::released,
                             verdict_outcome_[k]);
                ++c_.compensated;
                ++want;
            }
        }
        std::sort(asked_.begin(), asked_.end());
        std::sort(want_asked.begin(), want_asked.end());
        EXPECT(asked_ == want_asked, "compensation asked the resolver about exactly the expired claims");
        EXPECT(resolved == want, "compensate() count");
    }

    void collect() {
        const bool rotated = g_->collect();
        bool want = fill_[epoch_ & 1] >= std::max<std::uint64_t>(1, capacity / 2);
        const std::int64_t horizon = now() - std::chrono::nanoseconds(retention).count();
        for (auto& [k, m] : prev()) {
            const bool evictable = m.state == mst::released ||
                                   ((m.state == mst::succeeded || m.state == mst::failed) && m.updated <= horizon);
            if (!evictable) want = false;
        }
        EXPECT(rotated == want, "collect() rotates exactly when the previous generation is evictable");
        if (!rotated) return;
        for (auto& [k, m] : prev())
            if (m.state == mst::succeeded || m.state == mst::failed) ++c_.evicted;
        prev().clear();
        versions_[(epoch_ + 1) & 1].clear();  // the recycled generation's versions leave with it
        fill_[(epoch_ + 1) & 1] = 0;
        ++epoch_;
        ++c_.rotations;
    }

    // ---- the comparison after every step -----------------------------------------------------------
    void check_all() {
        for (std::size_t k = 0; k < keys; ++k) {
            const idem::record_view v = g_->query(names_[k]);
            const mrec* m = nullptr;
            if (auto it = cur().find(k); it != cur().end()) m = &it->second;
            else if (auto p = prev().find(k); p != prev().end()) m = &p->second;
            const std::string who = " of key " + std::to_string(k);
            if (!m) {
                EXPECT(v.state == record_state::absent && v.fence == 0, "query of an unknown key" + who);
                continue;
            }
            const record_state want = m->state == mst::processing  ? record_state::processing
                                      : m->state == mst::succeeded ? record_state::succeeded
                                      : m->state == mst::failed    ? record_state::failed
                                                                   : record_state::absent;
            EXPECT(v.state == want, "query state" + who);
            EXPECT(v.fence == m->fence, "query fence" + who);
            EXPECT(v.outcome == m->outcome, "query outcome" + who);
            EXPECT(v.fingerprint == m->fingerprint, "query fingerprint" + who);
            EXPECT(v.in_doubt == (m->doubt && m->state == mst::processing), "query doubt" + who);
            EXPECT(v.lease_until.count() == m->lease_until, "query lease" + who);
            const bool terminal = m->state == mst::succeeded || m->state == mst::failed;
            EXPECT(v.payload == (terminal ? m->payload : std::string()), "query payload" + who);
        }
        const idem::stats s = g_->snapshot();
        EXPECT(s.acquired == c_.acquired, "stats.acquired");
        EXPECT(s.duplicates == c_.duplicates, "stats.duplicates");
        EXPECT(s.in_progress_hits == c_.in_progress, "stats.in_progress_hits");
        EXPECT(s.payload_mismatches == c_.mismatch, "stats.payload_mismatches");
        EXPECT(s.succeeded == c_.succeeded, "stats.succeeded");
        EXPECT(s.failed == c_.failed, "stats.failed");
        EXPECT(s.released == c_.released, "stats.released");
        EXPECT(s.stale_tickets == c_.stale, "stats.stale_tickets");
        EXPECT(s.in_doubt == c_.in_doubt, "stats.in_doubt");
        EXPECT(s.compensated == c_.compensated, "stats.compensated");
        EXPECT(s.reclaimed == c_.reclaimed, "stats.reclaimed");
        EXPECT(s.evicted == c_.evicted, "stats.evicted");
        EXPECT(s.rotations == c_.rotations, "stats.rotations");
        EXPECT(s.superseded == c_.superseded, "stats.superseded");
    }

    bool terminal_, reclaim_, ordered_;
    std::map<std::size_t, std::uint32_t> versions_[2];  ///< ordered versions: identity -> newest version, per generation
    idem::manual_clock clock_;
    std::optional<guard_t> g_;
    std::vector<idem::key> names_;
    std::map<std::size_t, mrec> gen_[2];
    std::uint64_t epoch_ = 0;
    std::uint64_t fill_[2] = {0, 0};
    std::array<std::uint64_t, keys> max_fence_{};
    std::array<resolution, keys> verdict_{};
    std::array<std::uint64_t, keys> verdict_outcome_{};
    std::vector<std::size_t> asked_;
    std::vector<mticket> tickets_;
    counters c_;
    std::size_t steps_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    reader r{data, size};
    const std::uint8_t flags = r.byte();
    model_run run(flags & 1, flags & 2, flags & 4);
    for (int steps = 0; r.n > 0 && steps < 256; ++steps) run.step(r);
    return 0;
}
