// YAML's block subset that config files use (accelerate's config, Trainer and LLaMA-Factory recipes): nested
// mappings by indentation, "- " lists, flow lists [a, b], scalars (quoted or plain; true/false, null,
// numbers), comments. Anchors, tags, multi-line scalars, flow mappings with content and tabs are errors
// naming the line: a reader that guessed would map the wrong value. Read next: core/config/ecosystem.h.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace distlab {

// The document as JSON (keys in the file's order); ConfigError "name:line: ..." for what it does not read.
nlohmann::ordered_json parse_yaml_subset(const std::string& text, const std::string& name);

}  // namespace distlab
