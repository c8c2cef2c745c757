// A config key that takes one of a few names (parallel.strategy = "zero2", optim.name = "adamw") is read
// once, at load, into an enum: the code after that compares enums, never strings, so a misspelt name can
// only fail where the config is read, with the key and the names it takes.
//
// An enum opts in by naming its values in a ChoiceTable, beside its declaration:
//   enum class DdpMode { bucketed, naive };
//   template <> struct ChoiceTable<DdpMode> {
//     static constexpr std::array names = {choice(DdpMode::bucketed, "bucketed"), choice(DdpMode::naive, "naive")};
//   };
// and then has name_of(e), parse_choice<E>("naive"), choice_list<E>() ("bucketed or naive") and fmt's "{}".
// Read next: core/config/config.h (the keys that take them).
#pragma once
#include <fmt/format.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace distlab {

template <class E>
struct ChoiceTable;  // specialised beside each enum: static constexpr std::array names of choice(value, "name")

template <class E>
constexpr std::pair<E, std::string_view> choice(E value, std::string_view name) { return {value, name}; }

template <class E>
concept Choice = requires { ChoiceTable<E>::names; };

template <Choice E>
constexpr std::string_view name_of(E e) {
  for (const auto& [v, n] : ChoiceTable<E>::names)
    if (v == e) return n;
  return "?";
}

template <Choice E>
constexpr std::optional<E> parse_choice(std::string_view s) {
  for (const auto& [v, n] : ChoiceTable<E>::names)
    if (n == s) return v;
  return std::nullopt;
}

// "none, ddp, zero1, zero2, zero3 or fsdp"
template <Choice E>
std::string choice_list() {
  std::string out;
  const auto& names = ChoiceTable<E>::names;
  for (size_t i = 0; i < names.size(); i++) out += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i].second);
  return out;
}

}  // namespace distlab

// fmt::format("{}", DdpMode::naive) -> "naive"
template <distlab::Choice E>
struct fmt::formatter<E, char> : fmt::formatter<std::string_view, char> {
  template <class Ctx>
  auto format(E e, Ctx& ctx) const {
    return fmt::formatter<std::string_view, char>::format(distlab::name_of(e), ctx);
  }
};
