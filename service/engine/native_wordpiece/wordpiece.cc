// BERT's pre-tokenizer and WordPiece for normalized plain ASCII text (service/engine/plain_text.py), loaded
// with ctypes by __init__.py beside it. Same ids as the `tokenizers` library's BertPreTokenizer + WordPiece +
// [CLS] ... [SEP]: words split at whitespace, every ASCII punctuation character a word of its own, each word
// matched greedily longest-first against the vocabulary (continuations with the subword prefix), a word
// longer than max_word_chars or with an unmatched rest one unknown token.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Slot {
    uint64_t hash = 0;
    uint32_t start = 0, length = 0;
    int64_t id = -1;  // -1: empty
};

class Vocabulary {
  public:
    void add(const char* token, uint32_t length, int64_t id) {
        entries_.push_back({token, length, id});
        longest_ = length > longest_ ? length : longest_;
    }

    void index() {
        size_t size = 16;
        while (size < 2 * entries_.size()) size *= 2;
        slots_.assign(size, Slot{});
        size_t bytes = 0;
        for (const auto& entry : entries_) bytes += entry.length;
        text_.reserve(bytes);
        for (const auto& [token, length, id] : entries_) {
            uint32_t start = static_cast<uint32_t>(text_.size());
            text_.append(token, length);
            uint64_t hash = fnv(token, length);
            size_t at = hash & (size - 1);
            while (slots_[at].id >= 0) at = (at + 1) & (size - 1);
            slots_[at] = Slot{hash, start, length, id};
        }
        entries_.clear();
        entries_.shrink_to_fit();
    }

    int64_t find(const char* token, uint32_t length) const {
        uint64_t hash = fnv(token, length);
        size_t mask = slots_.size() - 1;
        for (size_t at = hash & mask; slots_[at].id >= 0; at = (at + 1) & mask) {
            const Slot& slot = slots_[at];
            if (slot.hash == hash && slot.length == length && !std::memcmp(&text_[slot.start], token, length))
                return slot.id;
        }
        return -1;
    }

    uint32_t longest() const { return longest_; }

  private:
    static uint64_t fnv(const char* data, uint32_t length) {
        uint64_t hash = 1469598103934665603ull;
        for (uint32_t i = 0; i < length; ++i) hash = (hash ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
        return hash;
    }

    struct Entry {
        const char* token;
        uint32_t length;
        int64_t id;
    };
    std::vector<Entry> entries_;  // until `index`
    std::vector<Slot> slots_;
    std::string text_;
    uint32_t longest_ = 0;
};

struct WordPiece {
    Vocabulary vocabulary;
    std::string prefix;  // of continuations: "##"
    int64_t unknown, cls, sep;
    uint32_t max_word_chars;
};

bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

bool is_punctuation(unsigned char c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

// One word's pieces appended to `out`.
void word_pieces(const WordPiece& wp, const char* word, uint32_t length, std::vector<int64_t>& out,
                 std::string& scratch) {
    if (length > wp.max_word_chars) {
        out.push_back(wp.unknown);
        return;
    }
    size_t before = out.size();
    uint32_t start = 0;
    while (start < length) {
        uint32_t end = length;
        int64_t found = -1;
        const uint32_t room = wp.vocabulary.longest();
        if (start == 0) {
            if (end > room) end = room;
            for (; end > start; --end)
                if ((found = wp.vocabulary.find(word, end)) >= 0) break;
        } else {
            scratch.assign(wp.prefix);
            scratch.append(word + start, length - start);
            uint32_t most = static_cast<uint32_t>(scratch.size());
            if (most > room) most = room;
            for (uint32_t size = most; size > wp.prefix.size(); --size)
                if ((found = wp.vocabulary.find(scratch.data(), size)) >= 0) {
                    end = start + size - static_cast<uint32_t>(wp.prefix.size());
                    break;
                }
        }
        if (found < 0) {
            out.resize(before);
            out.push_back(wp.unknown);
            return;
        }
        out.push_back(found);
        start = end;
    }
}

void pieces(const WordPiece& wp, const char* text, int64_t length, std::vector<int64_t>& out, std::string& scratch) {
    int64_t word = -1;  // where the current word starts
    for (int64_t i = 0; i <= length; ++i) {
        unsigned char c = i < length ? static_cast<unsigned char>(text[i]) : ' ';
        bool space = is_space(c), punctuation = !space && is_punctuation(c);
        if ((space || punctuation) && word >= 0) {
            word_pieces(wp, text + word, static_cast<uint32_t>(i - word), out, scratch);
            word = -1;
        }
        if (punctuation)
            word_pieces(wp, text + i, 1, out, scratch);
        else if (!space && word < 0)
            word = i;
    }
}

}  // namespace

extern "C" {

// tokens: the vocabulary's tokens back to back, lengths[i] bytes each, ids[i] the id of token i. Null when
// it cannot be made (out of memory).
void* wordpiece_new(const char* tokens, const int64_t* lengths, const int64_t* ids, int64_t count,
                    const char* prefix, int64_t unknown, int64_t cls, int64_t sep, int64_t max_word_chars) {
    try {
        auto* wp = new WordPiece{};
        const char* at = tokens;
        for (int64_t i = 0; i < count; ++i) {
            wp->vocabulary.add(at, static_cast<uint32_t>(lengths[i]), ids[i]);
            at += lengths[i];
        }
        wp->vocabulary.index();
        wp->prefix = prefix;
        wp->unknown = unknown;
        wp->cls = cls;
        wp->sep = sep;
        wp->max_word_chars = static_cast<uint32_t>(max_word_chars);  // at most 2^32 - 1 (the caller clamps)
        return wp;
    } catch (...) {
        return nullptr;
    }
}

void wordpiece_free(void* handle) { delete static_cast<WordPiece*>(handle); }

// For each of `count` texts (texts[ends[i-1]:ends[i]]): [CLS], its first (or with `left`, last) `keep` word
// pieces, [SEP] into out[starts[i]:], and in totals[i] how many word pieces the whole text has. Each row needs
// at most min(its bytes, keep) + 2 ids: every piece takes at least one character. 0, or -1 out of memory.
int wordpiece_encode(const void* handle, const char* texts, const int64_t* ends, int64_t count, int64_t keep,
                     int32_t left, int64_t* out, const int64_t* starts, int64_t* totals) {
    const auto& wp = *static_cast<const WordPiece*>(handle);
    try {
        std::vector<int64_t> ids;
        std::string scratch;
        int64_t start = 0;
        for (int64_t i = 0; i < count; ++i) {
            ids.clear();
            pieces(wp, texts + start, ends[i] - start, ids, scratch);
            start = ends[i];
            int64_t total = static_cast<int64_t>(ids.size()), kept = total < keep ? total : keep;
            int64_t* row = out + starts[i];
            row[0] = wp.cls;
            if (kept > 0) std::memcpy(row + 1, ids.data() + (left ? total - kept : 0), kept * sizeof(int64_t));
            row[kept + 1] = wp.sep;
            totals[i] = total;
        }
    } catch (...) {
        return -1;
    }
    return 0;
}

}  // extern "C"
