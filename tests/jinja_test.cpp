// Tests for the Jinja2 interpreter (src/server/jinja) and the chat-template
// renderer (src/server/chat_template): real model templates against the
// llama.cpp-rendered fixtures, language features against hand-derived
// Jinja2 results, error reporting, resource limits and a fuzz pass.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <fstream>
#include <random>
#include <thread>
#include <atomic>
#include <sstream>

#include "server/chat_template.h"
#include "server/jinja/template.h"
#include "server/jinja/value.h"
#include "test_support.h"
#include "util/error.h"

namespace reprise {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// The fixtures were rendered on 2026-11-21; noon local time keeps the date
// right in every time zone the test might run in.
std::time_t fixture_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 21;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

jinja::RenderOptions fixed_clock() {
  jinja::RenderOptions options;
  options.now = fixture_now;
  return options;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string render(std::string_view source, const json& context = json::object(),
                   const jinja::ParseOptions& parse_options = {}) {
  return jinja::Template::parse(source, parse_options).render(context, fixed_clock());
}

// Jinja2's own defaults (no trim/lstrip), for whitespace tests.
jinja::ParseOptions plain_jinja() {
  jinja::ParseOptions o;
  o.trim_blocks = false;
  o.lstrip_blocks = false;
  return o;
}

std::string error_of(std::string_view source, const json& context = json::object(),
                     const jinja::RenderOptions& options = fixed_clock()) {
  try {
    jinja::Template::parse(source).render(context, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::vector<fs::path> fixture_templates(const std::string& fixtures) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(fs::path(fixtures) / "templates")) {
    if (entry.path().extension() == ".jinja") out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string fixture_template(const std::string& fixtures, const std::string& name) {
  return read_file(fs::path(fixtures) / "templates" / (name + ".jinja"));
}

// ------------------------------------------------------------------ fixtures

TEST(ChatTemplateFixtures, RenderEveryConversationExactly) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto templates = fixture_templates(fixtures);
  ASSERT_FALSE(templates.empty());
  const int64_t containers_before = jinja::live_containers();
  int cases = 0;
  for (const fs::path& path : templates) {
    fs::path expected_path = path;
    expected_path.replace_extension(".expected.json");
    json expected = json::parse(read_file(expected_path));
    ChatTemplate chat(read_file(path));
    for (const json& c : expected["cases"]) {
      ChatTemplateInputs inputs;
      inputs.messages = c["messages"];
      inputs.add_generation_prompt = expected["add_generation_prompt"].get<bool>();
      // llama.cpp rendered these with a Llama SPM vocab (<s>, </s>) and drops
      // the leading BOS its tokenizer adds anyway.
      inputs.bos_token = "<s>";
      inputs.eos_token = "</s>";
      inputs.tokenizer_adds_bos = true;
      std::string got;
      try {
        got = chat.apply(inputs, fixed_clock());
      } catch (const Error& e) {
        ADD_FAILURE() << path.filename() << " / " << c["name"] << ": " << e.what();
        continue;
      }
      EXPECT_EQ(got, c["prompt"].get<std::string>()) << path.filename() << " / " << c["name"];
      ++cases;
    }
  }
  std::cout << "[ fixtures ] " << templates.size() << " templates, " << cases << " conversations rendered\n";
  EXPECT_EQ(jinja::live_containers(), containers_before) << "values leaked by a render";
}

TEST(ChatTemplateFixtures, ConversationFileMatchesExpectations) {
  REPRISE_REQUIRE_SHARED(fixtures);
  json convs = json::parse(read_file(fs::path(fixtures) / "templates" / "convs.json"));
  for (const fs::path& path : fixture_templates(fixtures)) {
    fs::path expected_path = path;
    expected_path.replace_extension(".expected.json");
    json expected = json::parse(read_file(expected_path));
    ASSERT_EQ(expected["cases"].size(), convs.size()) << path.filename();
    for (size_t i = 0; i < convs.size(); ++i) {
      EXPECT_EQ(expected["cases"][i]["messages"], convs[i]["messages"]) << path.filename();
    }
  }
}


// ------------------------------------------------------- language features
// Expected strings are derived by hand from Jinja2 semantics (and were
// cross-checked against Jinja2 3.1 while writing them).

TEST(JinjaLiterals, Numbers) {
  EXPECT_EQ(render("{{ 1 }} {{ 1.0 }} {{ 1.5e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }}"),
            "1 1.0 1.5e+20 1e-05 0.30000000000000004 1e+16 1000000000000000.0");
}

TEST(JinjaLiterals, Arithmetic) {
  EXPECT_EQ(render("{{ 10/4 }} {{ 10//4 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2 ** 3 ** 2 }} {{ 6 / 2 }} {{ 7.5 // 2 }}"),
            "2.5 2 -4 2 -2 1024 64 3.0 3.0");
}

TEST(JinjaLiterals, Precedence) {
  EXPECT_EQ(render("{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }} {{ (1 + 2) ~ 3 }} {{ 1 ~ 2 * 3 }} {{ -2 ** 2 }}"),
            "14 20 5 33 16 4");
}

TEST(JinjaLiterals, Constants) {
  EXPECT_EQ(render("{{ none }} {{ true }} {{ false }} {{ None }} {{ True }} {{ False }}"),
            "None True False None True False");
}

TEST(JinjaLiterals, Containers) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5] }} {{ {'a': 1, 'b': [1, 2]} }} {{ (1,) }} {{ (1, 'x') }} {{ () }}"),
            "[1, 'a', None, True, 1.5] {'a': 1, 'b': [1, 2]} (1,) (1, 'x') ()");
}

TEST(JinjaLiterals, StringEscapes) {
  EXPECT_EQ(render("{{ 'a\\tb\\\\c\\x41\\u00e9\\d' }}|{{ 'it\\'s' }}|{{ \"say \\\"hi\\\"\" }}|{{ 'x\\ny' }}"),
            "a\tb\\cAé\\d|it's|say \"hi\"|x\ny");
}

TEST(JinjaLiterals, StringReprQuotes) {
  EXPECT_EQ(render("{{ ['it\\'s', 'q\"', 'a\\nb', 'é'] }}"),
            "[\"it's\", 'q\"', 'a\\nb', 'é']");
}

TEST(JinjaLiterals, AdjacentStrings) {
  EXPECT_EQ(render("{{ 'a' 'b' \"c\" }}"),
            "abc");
}

TEST(JinjaLiterals, Concat) {
  EXPECT_EQ(render("{{ 'abc' ~ 1 ~ none ~ missing ~ 2.50 }}"),
            "abc1None2.5");
}

TEST(JinjaLiterals, Repeat) {
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1] * 3 }} {{ 3 * 'x' }} {{ 'x' * 0 }}|"),
            "ababab [1, 1, 1] xxx |");
}

TEST(JinjaLiterals, Unicode) {
  EXPECT_EQ(render("{{ 'café'|upper }} {{ 'ÉCOLE'|lower }} {{ 'straße'|upper }} {{ 'é'|length }} {{ 'aé'[1] }} {{ 'naïve café'|title }}"),
            "CAFÉ école STRASSE 1 é Naïve Café");
}

TEST(JinjaSlicing, Strings) {
  EXPECT_EQ(render("{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[-2:] }} {{ 'héllo'[1:] }} {{ 'abc'[5:] }}|{{ 'abcdef'[1:5:2] }}"),
            "el olleh lo éllo |bd");
}

TEST(JinjaSlicing, Lists) {
  EXPECT_EQ(render("{{ x[1:] }} {{ x[:1] }} {{ x[-1] }} {{ x[::2] }} {{ x[:-1] }} {{ x[10] }}|{{ x[-10:2] }}", json::parse("{\"x\": [1, 2, 3]}")),
            "[2, 3] [1] 3 [1, 3] [1, 2] |[1, 2]");
}

TEST(JinjaSlicing, AttributeIndex) {
  EXPECT_EQ(render("{{ x.0 }} {{ x.1 }} {{ x[0] }}", json::parse("{\"x\": [7, 8]}")),
            "7 8 7");
}

TEST(JinjaSlicing, DictAccess) {
  EXPECT_EQ(render("{{ d.a }} {{ d['a'] }} {{ d.items is callable }}|{{ d['items'] }}|{{ d.missing }}|", json::parse("{\"d\": {\"a\": 1, \"items\": 5}}")),
            "1 1 True|5||");
}

TEST(JinjaOperators, IfElifElse) {
  EXPECT_EQ(render("{% if x %}a{% elif y %}b{% else %}c{% endif %}{% if not x and y %}d{% endif %}", json::parse("{\"x\": false, \"y\": true}")),
            "bd");
}

TEST(JinjaOperators, Ternary) {
  EXPECT_EQ(render("{{ 'yes' if x else 'no' }} {{ 'yes' if not x else 'no' }} [{{ 'a' if false }}]", json::parse("{\"x\": true}")),
            "yes no []");
}

TEST(JinjaOperators, AndOrReturnOperands) {
  EXPECT_EQ(render("{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ [] or none }} {{ not 0 }} {{ req or [] }}"),
            "2 0 x None True []");
}

TEST(JinjaOperators, Comparisons) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'a' != 'b' }}"),
            "True False True True True True True");
}

TEST(JinjaOperators, Membership) {
  EXPECT_EQ(render("{{ 1 in [1, 2] }} {{ 3 not in [1, 2] }} {{ 'b' in 'abc' }} {{ 'k' in {'k': 1} }} {{ 'z' in {'k': 1} }} {{ 'x' in missing }}"),
            "True True True True False False");
}

TEST(JinjaOperators, ListAndStringAdd) {
  EXPECT_EQ(render("{{ [1, 2] + [3] }} {{ 'a' + 'b' }} {{ 1.5 + 1 }}"),
            "[1, 2, 3] ab 2.5");
}

TEST(JinjaOperators, FilterBindsTighterThanPlus) {
  EXPECT_EQ(render("{{ ' a '|trim + 'b' }} {{ -x|abs }} {{ 'x' ~ 'y'|upper }}", json::parse("{\"x\": 3}")),
            "ab 3 xY");
}

TEST(JinjaOperators, PercentFormat) {
  EXPECT_EQ(render("{{ 'abc %s' % 'x' }} {{ '%s %s' % (1, 2) }} {{ '%(a)s' % {'a': 'z'} }} {{ '%05.1f|%-4s|%x|%3d' % (3.14159, 'ab', 255, 7) }}"),
            "abc x 1 2 z 003.1|ab  |ff|  7");
}

TEST(JinjaLoops, LoopVariables) {
  EXPECT_EQ(render("{% for i in 'abc' %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}"),
            "1/0/3/2/True/False/3;2/1/2/1/False/False/3;3/2/1/0/False/True/3;");
}

TEST(JinjaLoops, PrevNextItem) {
  EXPECT_EQ(render("{% for i in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}"),
            "-2;1-3;2-;");
}

TEST(JinjaLoops, Cycle) {
  EXPECT_EQ(render("{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}"),
            "ababa");
}

TEST(JinjaLoops, TupleUnpacking) {
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", json::parse("{\"d\": {\"b\": 1, \"a\": 2}}")),
            "b=1,a=2,37");
}

TEST(JinjaLoops, Else) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %} {% for x in missing %}x{% else %}none{% endfor %}"),
            "empty none");
}

TEST(JinjaLoops, InlineFilter) {
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}"),
            "1:1/3 3:2/3 5:3/3 ");
}

TEST(JinjaLoops, BreakContinue) {
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 3 %}{% continue %}{% endif %}{% if x == 6 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "01245");
}

TEST(JinjaLoops, OverStringsAndDicts) {
  EXPECT_EQ(render("{% for c in 'ab' %}{{ c }}.{% endfor %}{% for k in d %}{{ k }}{% endfor %}", json::parse("{\"d\": {\"z\": 1, \"y\": 2}}")),
            "a.b.zy");
}

TEST(JinjaLoops, NestedLoopShadowsLoop) {
  EXPECT_EQ(render("{% for x in [1, 2] %}{% for y in 'ab' %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}"),
            "11a 21b 1|12a 22b 2|");
}

TEST(JinjaLoops, Range) {
  EXPECT_EQ(render("{% for x in range(2, 10, 3) %}{{ x }}{% endfor %} {{ range(5)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}"),
            "258 [0, 1, 2, 3, 4] [5, 3, 1] []");
}

TEST(JinjaLoops, ReverseIteration) {
  EXPECT_EQ(render("{% for m in msgs[::-1] %}{{ m }}{% endfor %}", json::parse("{\"msgs\": [\"a\", \"b\", \"c\"]}")),
            "cba");
}

TEST(JinjaScoping, SetDoesNotLeakFromLoop) {
  EXPECT_EQ(render("{% set found = false %}{% for x in [1] %}{% set found = true %}{% endfor %}{{ found }}"),
            "False");
}

TEST(JinjaScoping, NamespaceCarriesOut) {
  EXPECT_EQ(render("{% set ns = namespace(found=false, n=0) %}{% for x in [1, 2] %}{% set ns.found = true %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.found }} {{ ns.n }}"),
            "True 3");
}

TEST(JinjaScoping, NamespaceFromDict) {
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{% set ns.c = 3 %}{{ ns.c }}"),
            "123");
}

TEST(JinjaScoping, SetInIfIsVisible) {
  EXPECT_EQ(render("{% if true %}{% set x = 5 %}{% endif %}{{ x }}"),
            "5");
}

TEST(JinjaScoping, TupleSet) {
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = ['x', 'y'] %}{{ c }}{{ d }}"),
            "12xy");
}

TEST(JinjaScoping, BlockSet) {
  EXPECT_EQ(render("{% set x %}hello {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}"),
            "[hello 2]ABC");
}

TEST(JinjaScoping, ShadowContextVariable) {
  EXPECT_EQ(render("{% set messages = messages[1:] %}{{ messages|length }}", json::parse("{\"messages\": [1, 2, 3]}")),
            "2");
}

TEST(JinjaMacros, DefaultsAndKeywords) {
  EXPECT_EQ(render("{% macro greet(name, greeting='Hi') %}{{ greeting }} {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Yo') }} {{ greet(name='Z') }}"),
            "Hi Bob! Yo Al! Hi Z!");
}

TEST(JinjaMacros, Recursion) {
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}"),
            "4321");
}

TEST(JinjaMacros, CallBlock) {
  EXPECT_EQ(render("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside{% endcall %}"),
            "<inside>");
}

TEST(JinjaMacros, CallBlockWithArgs) {
  EXPECT_EQ(render("{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}"),
            "[1][2]");
}

TEST(JinjaMacros, VarargsKwargs) {
  EXPECT_EQ(render("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, a=3) }}"),
            "(1, 2){'a': 3}");
}

TEST(JinjaMacros, MissingArgumentIsUndefined) {
  EXPECT_EQ(render("{% macro m(a, b) %}{{ a }}|{{ b }}|{{ b is defined }}{% endmacro %}{{ m(1) }}"),
            "1||False");
}

TEST(JinjaMacros, SeesTemplateVariables) {
  EXPECT_EQ(render("{% set g = 'G' %}{% macro m() %}{{ g }}{{ ctx }}{% endmacro %}{{ m() }}", json::parse("{\"ctx\": \"C\"}")),
            "GC");
}

TEST(JinjaMacros, SetInsideMacroIsLocal) {
  EXPECT_EQ(render("{% set v = 1 %}{% macro m() %}{% set v = 2 %}{{ v }}{% endmacro %}{{ m() }}{{ v }}"),
            "21");
}

TEST(JinjaMacros, ResultIsAString) {
  EXPECT_EQ(render("{% macro m() %}x{% endmacro %}{{ m() ~ 'y' }} {{ m()|length }} {{ m() is string }}"),
            "xy 1 True");
}

TEST(JinjaFilters, StringCase) {
  EXPECT_EQ(render("{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'hello world'|upper }}|{{ 'HeLLo'|lower }}|{{ 'hello world-foo(bar'|title }}|{{ 'hELLO wORLD'|capitalize }}"),
            "hi|hi|HELLO WORLD|hello|Hello World-Foo(Bar|Hello world");
}

TEST(JinjaFilters, LengthFirstLast) {
  EXPECT_EQ(render("{{ [3, 1, 2]|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }} {{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} [{{ []|first }}] {{ missing|length }}"),
            "3 5 1 1 3 a [] 0");
}

TEST(JinjaFilters, Join) {
  EXPECT_EQ(render("{{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ users|join('-', attribute='n') }}", json::parse("{\"users\": [{\"n\": \"x\"}, {\"n\": \"y\"}]}")),
            "1, 2, 3 ab x-y");
}

TEST(JinjaFilters, Default) {
  EXPECT_EQ(render("{{ missing|default('dflt') }} {{ ''|default('e', true) }} [{{ ''|d('e') }}] {{ none|default('n') }} {{ 0|default(5, boolean=true) }}"),
            "dflt e [] None 5");
}

TEST(JinjaFilters, ToJson) {
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 2.5, 'x', none, true]}|tojson }}"),
            "{\"b\": 1, \"a\": [1, 2.5, \"x\", null, true]}");
}

TEST(JinjaFilters, ToJsonIndent) {
  EXPECT_EQ(render("{{ {'a': 1, 'b': [1, {'c': []}, {}]}|tojson(indent=2) }}"),
            "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    },\n    {}\n  ]\n}");
}

TEST(JinjaFilters, ToJsonStrings) {
  EXPECT_EQ(render("{{ 'héllo \"q\" \\n'|tojson }} {{ 1.0|tojson }} {{ [1e100, -0.0]|tojson }} {{ '\\x01'|tojson }}"),
            "\"héllo \\\"q\\\" \\n\" 1.0 [1e+100, -0.0] \"\\u0001\"");
}

TEST(JinjaFilters, ToJsonOptions) {
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ 'é'|tojson(ensure_ascii=true) }} {{ [1, {'k': 2}]|tojson(separators=(',', ':')) }}"),
            "{\"a\": 2, \"b\": 1} \"\\u00e9\" [1,{\"k\":2}]");
}

TEST(JinjaFilters, ToJsonKeepsKeyOrder) {
  EXPECT_EQ(render("{{ tool|tojson }}", json::parse("{\"tool\": {\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": {}}}}")),
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": {}}}");
}

TEST(JinjaFilters, ListItems) {
  EXPECT_EQ(render("{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|list }} {{ d|items|list }} {{ d|dictsort }}", json::parse("{\"d\": {\"y\": [2], \"x\": 1}}")),
            "['a', 'b', 'c'] ['a', 'b'] [('y', [2]), ('x', 1)] [('x', 1), ('y', [2])]");
}

TEST(JinjaFilters, Replace) {
  EXPECT_EQ(render("{{ 'aXbXc'|replace('X', '-') }} {{ 'aaa'|replace('a', 'b', 2) }}"),
            "a-b-c bba");
}

TEST(JinjaFilters, IntFloat) {
  EXPECT_EQ(render("{{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'abc'|int }} {{ 'abc'|int(7) }} {{ 3.9|int }} {{ '0x1f'|int(base=16) }} {{ ' 12 '|int }} {{ '1.5'|float }} {{ 'x'|float }} {{ 3|float }}"),
            "43 4 0 7 3 31 12 1.5 0.0 3.0");
}

TEST(JinjaFilters, AbsRound) {
  EXPECT_EQ(render("{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 5|round }}"),
            "3 2.5 2.0 4.0 2.67 3.0 2.0 5");
}

TEST(JinjaFilters, StringFilter) {
  EXPECT_EQ(render("{{ 42|string ~ 'x' }} {{ [1]|string }} {{ none|string }}"),
            "42x [1] None");
}

TEST(JinjaFilters, SelectAttrMap) {
  EXPECT_EQ(render("{{ users|selectattr('active')|map(attribute='name')|list }} {{ users|rejectattr('active')|map(attribute='name')|join }} {{ users|selectattr('name', 'equalto', 'c')|list|length }}", json::parse("{\"users\": [{\"name\": \"a\", \"active\": true}, {\"name\": \"b\", \"active\": false}, {\"name\": \"c\"}]}")),
            "['a'] bc 1");
}

TEST(JinjaFilters, SelectReject) {
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5]|select('odd')|list }} {{ [1, 2, 3, 4, 5]|reject('odd')|list }} {{ [0, 1, '', none, 'a']|select|list }} {{ [1, 2, 3]|select('greaterthan', 1)|list }}"),
            "[1, 3, 5] [2, 4] [1, 'a'] [2, 3]");
}

TEST(JinjaFilters, MapFilterAndDefault) {
  EXPECT_EQ(render("{{ ['a', 'b']|map('upper')|list }} {{ [[1], [2, 3]]|map('length')|list }} {{ users|map(attribute='x', default='d')|list }} {{ ['a']|map('replace', 'a', 'b')|list }}", json::parse("{\"users\": [{\"x\": 1}, {}]}")),
            "['A', 'B'] [1, 2] [1, 'd'] ['b']");
}

TEST(JinjaFilters, Sort) {
  EXPECT_EQ(render("{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='n')|join }}", json::parse("{\"users\": [{\"n\": \"x\", \"age\": 3}, {\"n\": \"y\", \"age\": 1}]}")),
            "[1, 2, 3] ['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1] yx");
}

TEST(JinjaFilters, UniqueReverse) {
  EXPECT_EQ(render("{{ [1, 2, 1, 3, 2]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ [3, 1, 2]|reverse|list }} {{ 'abc'|reverse }}"),
            "[1, 2, 3] ['a', 'b'] [2, 1, 3] cba");
}

TEST(JinjaFilters, SafeEscapeCenterWordcount) {
  EXPECT_EQ(render("{{ 'hello'|safe }} {{ '<a href=\"x\">&</a>'|e }} [{{ 'ab'|center(6) }}] {{ 'a b  c'|wordcount }}"),
            "hello &lt;a href=&#34;x&#34;&gt;&amp;&lt;/a&gt; [  ab  ] 3");
}

TEST(JinjaFilters, Indent) {
  EXPECT_EQ(render("{{ 'l1\\nl2\\n\\nl3'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}"),
            "l1\n    l2\n\n    l3|  a\n  b|a\n  \n  b|a\n> b");
}

TEST(JinjaFilters, Batch) {
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }}"),
            "[[1, 2], [3, 4], [5]] [[1, 2], [3, 'x']]");
}

TEST(JinjaFilters, MinMaxSum) {
  EXPECT_EQ(render("{{ [1, 5, 3]|max }} {{ [1, 5, 3]|min }} {{ [1, 2, 3]|sum }} {{ users|sum(attribute='v') }} {{ ['b', 'A']|max }}", json::parse("{\"users\": [{\"v\": 1}, {\"v\": 2.5}]}")),
            "5 1 6 3.5 b");
}

TEST(JinjaFilters, FormatTruncate) {
  EXPECT_EQ(render("{{ '%s-%d'|format('a', 3) }} {{ 'a very long sentence here'|truncate(10) }} {{ 'a very long sentence here'|truncate(10, true) }} {{ 'short'|truncate(10) }}"),
            "a-3 a very... a very ... short");
}

TEST(JinjaFilters, FilterBlock) {
  EXPECT_EQ(render("{% filter upper %}hello {{ 'x' }}{% endfilter %} {% filter trim|upper %}  hi  {% endfilter %}"),
            "HELLO X HI");
}

TEST(JinjaFilters, GeneratorsAreTruthy) {
  EXPECT_EQ(render("{% if []|select('odd') %}gen{% endif %} {% if []|select('odd')|list %}list{% else %}empty{% endif %}"),
            "gen empty");
}

TEST(JinjaTests, Types) {
  EXPECT_EQ(render("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ 1.0 is integer }} {{ 1.0 is float }}", json::parse("{\"x\": 1}")),
            "True False True True True True True True False True");
}

TEST(JinjaTests, Containers) {
  EXPECT_EQ(render("{{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ range is callable }} {{ 'x' is callable }}"),
            "True False True True False True True False");
}

TEST(JinjaTests, Booleans) {
  EXPECT_EQ(render("{{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}"),
            "True False True False True False");
}

TEST(JinjaTests, Numbers) {
  EXPECT_EQ(render("{{ 3 is odd }} {{ 3 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ -3 is odd }}"),
            "True False True False True");
}

TEST(JinjaTests, Comparisons) {
  EXPECT_EQ(render("{{ 2 is eq 2 }} {{ 2 is ne 2 }} {{ 1 is lt 2 }} {{ 3 is gt 2 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 1 is in [1, 2] }} {{ 'a' is equalto 'a' }} {{ none is sameas none }}"),
            "True False True True True False True True True");
}

TEST(JinjaTests, CaseAndNegation) {
  EXPECT_EQ(render("{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ x is not none }} {{ not x is none }} {{ x is not defined }}", json::parse("{\"x\": null}")),
            "True True False False False");
}

TEST(JinjaMethods, Strip) {
  EXPECT_EQ(render("[{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ '\\n\\nx'.lstrip('\\n') }}]"),
            "[x|hi|x|x|x]");
}

TEST(JinjaMethods, Split) {
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'x</think>y'.split('</think>')[-1] }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a,b', 'c'] y");
}

TEST(JinjaMethods, PrefixSuffixReplace) {
  EXPECT_EQ(render("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.replace('l', 'L') }} {{ 'hello'.replace('l', 'L', 1) }}"),
            "True True True heLLo heLlo");
}

TEST(JinjaMethods, Case) {
  EXPECT_EQ(render("{{ 'hello'.upper() }} {{ 'HeLLo'.lower() }} {{ 'hello world'.title() }} {{ \"they're\".title() }} {{ 'hello'.capitalize() }}"),
            "HELLO hello Hello World They'Re Hello");
}

TEST(JinjaMethods, Format) {
  EXPECT_EQ(render("{{ '{} and {}'.format('a', 'b') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='Z') }} {{ '{:>5}|{:<5}|{:^5}|{:05.2f}|{:,}'.format('a', 'b', 'c', 3.14159, 1234567) }} {{ '{{literal}}'.format() }}"),
            "a and b xyx Z!     a|b    |  c  |03.14|1,234,567 {literal}");
}

TEST(JinjaMethods, FindCountLines) {
  EXPECT_EQ(render("{{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ 'héllo'.find('l') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ ', '.join(['a', 'b']) }}"),
            "2 -1 3 2 2 ['a', 'b', 'c'] ['a\\n', 'b\\n'] a, b");
}

TEST(JinjaMethods, Predicates) {
  EXPECT_EQ(render("{{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ '  '.isspace() }} {{ 'ab'.isupper() }} {{ 'x'.zfill(3) }} {{ 'ab'.center(7, '*') }} {{ 'ab'.ljust(4, '.') }}| {{ 'a=b=c'.partition('=') }}"),
            "True True True False 00x ***ab** ab..| ('a', '=', 'b=c')");
}

TEST(JinjaMethods, Dict) {
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}", json::parse("{\"d\": {\"a\": 1, \"b\": 2}}")),
            "1 None 5 ['a', 'b'] [1, 2] [('a', 1), ('b', 2)]");
}

TEST(JinjaMethods, ListMutation) {
  EXPECT_EQ(render("{% set l = [1] %}{% set _ = l.append(2) %}{{ l }} {{ l.pop() }} {{ l }} {{ [5, 6, 7].index(6) }}{% do l.extend([3, 4]) %} {{ l }} {{ l.count(3) }} {% set _ = l.insert(0, 9) %}{{ l }}"),
            "[1, 2] 2 [1] 1 [1, 3, 4] 1 [9, 1, 3, 4]");
}

TEST(JinjaMethods, DictMutation) {
  EXPECT_EQ(render("{% set d = {} %}{% do d.update({'a': 1}) %}{{ d }} {{ d.setdefault('b', 2) }} {{ d }} {{ d.pop('a') }} {{ d }}"),
            "{'a': 1} 2 {'a': 1, 'b': 2} 1 {'b': 2}");
}

TEST(JinjaMethods, AppendThroughNamespace) {
  EXPECT_EQ(render("{% set ns = namespace(items=[]) %}{% for x in 'ab' %}{% set _ = ns.items.append(x) %}{% endfor %}{{ ns.items }}"),
            "['a', 'b']");
}

TEST(JinjaGlobals, DictAndNamespace) {
  EXPECT_EQ(render("{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }} {{ namespace(a=1).a }}"),
            "{'a': 1, 'b': 2} {'x': 1, 'y': 2} 1");
}

TEST(JinjaGlobals, StrftimeNow) {
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d') }} {{ strftime_now('%B %d, %Y') }} {{ strftime_now('%d %b %Y') }}"),
            "2026-11-21 November 21, 2026 21 Nov 2026");
}

TEST(JinjaGlobals, Joiner) {
  EXPECT_EQ(render("{% set j = joiner('|') %}{% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %}"),
            "a|b|c");
}

TEST(JinjaUndefined, PrintsEmpty) {
  // Lenient by design: Jinja2 raises on attribute access of an undefined value
  // (nope.attr); reprise yields undefined, as llama.cpp does.
  EXPECT_EQ(render("[{{ nope }}] [{{ nope.attr }}] [{{ nope['k'] }}] [{{ nope.a.b }}] {{ nope|length }} {{ nope is defined }} {{ nope.attr is defined }}{% for x in nope %}x{% endfor %}"),
            "[] [] [] [] 0 False False");
}

TEST(JinjaUndefined, MissingKeys) {
  EXPECT_EQ(render("{{ msg.content }}|{{ msg.missing is defined }}|{{ msg['content'] }}|{{ msg.tool_calls is not defined }}", json::parse("{\"msg\": {\"content\": \"hi\"}}")),
            "hi|False|hi|True");
}

TEST(JinjaUndefined, Falsy) {
  EXPECT_EQ(render("{% if nope %}a{% else %}b{% endif %}{% if not nope %}c{% endif %}{{ nope|default('d') }}{{ nope ~ 'e' }}"),
            "bcde");
}

// ------------------------------------------------------- whitespace control
// First expectation: HF's trim_blocks + lstrip_blocks (our default).
// Second: plain Jinja2 defaults (both off).

TEST(JinjaWhitespace, DashStripsBothSides) {
  EXPECT_EQ(render("a  {%- if true %}  b  {% endif -%}  c"), "a  b  c");
  EXPECT_EQ(render("a  {%- if true %}  b  {% endif -%}  c", json::object(), plain_jinja()), "a  b  c");
}

TEST(JinjaWhitespace, DashOnExpressions) {
  EXPECT_EQ(render("<{{- ' x ' -}}>|  {{- 'y' }}  |"), "< x >|y  |");
  EXPECT_EQ(render("<{{- ' x ' -}}>|  {{- 'y' }}  |", json::object(), plain_jinja()), "< x >|y  |");
}

TEST(JinjaWhitespace, DashStripsNewlines) {
  EXPECT_EQ(render("a\n\n  {%- if true -%}\n\n  b\n{%- endif %}"), "ab");
  EXPECT_EQ(render("a\n\n  {%- if true -%}\n\n  b\n{%- endif %}", json::object(), plain_jinja()), "ab");
}

TEST(JinjaWhitespace, Comments) {
  EXPECT_EQ(render("{# comment #}a{#- c -#}  b"), "ab");
  EXPECT_EQ(render("{# comment #}a{#- c -#}  b", json::object(), plain_jinja()), "ab");
}

TEST(JinjaWhitespace, TrimBlocksDropsNewlineAfterTag) {
  EXPECT_EQ(render("line1\n{% if true %}\nline2\n{% endif %}\nline3"), "line1\nline2\nline3");
  EXPECT_EQ(render("line1\n{% if true %}\nline2\n{% endif %}\nline3", json::object(), plain_jinja()), "line1\n\nline2\n\nline3");
}

TEST(JinjaWhitespace, LstripBlocksDropsIndent) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n", json::object(), plain_jinja()), "  \n  x\n  ");
}

TEST(JinjaWhitespace, PlusDisablesLstrip) {
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}\n"), "  x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}\n", json::object(), plain_jinja()), "  x");
}

TEST(JinjaWhitespace, ExpressionsAreNotTrimmed) {
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n"), "a\nb");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n", json::object(), plain_jinja()), "a\nb");
}

TEST(JinjaWhitespace, CommentOnOwnLine) {
  EXPECT_EQ(render("a\n  {# comment #}\nb"), "a\nb");
  EXPECT_EQ(render("a\n  {# comment #}\nb", json::object(), plain_jinja()), "a\n  \nb");
}

TEST(JinjaWhitespace, LoopBodyLines) {
  EXPECT_EQ(render("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n"), "  1\n  2\n");
  EXPECT_EQ(render("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", json::object(), plain_jinja()), "\n  1\n\n  2\n");
}

TEST(JinjaWhitespace, KeepsOneTrailingNewlineRule) {
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("x\n\n", json::object(), plain_jinja()), "x\n");
}

TEST(JinjaWhitespace, CrLfNormalized) {
  EXPECT_EQ(render("x\r\ny\r\n{% if true %}\r\nz{% endif %}"), "x\ny\nz");
  EXPECT_EQ(render("x\r\ny\r\n{% if true %}\r\nz{% endif %}", json::object(), plain_jinja()), "x\ny\n\nz");
}

TEST(JinjaWhitespace, Raw) {
  EXPECT_EQ(render("{% raw %}{{ not rendered }}{% endraw %}"), "{{ not rendered }}");
  EXPECT_EQ(render("{% raw %}{{ not rendered }}{% endraw %}", json::object(), plain_jinja()), "{{ not rendered }}");
}

TEST(JinjaWhitespace, RawWithDashes) {
  EXPECT_EQ(render("a {%- raw -%} {{ x }} {%- endraw -%} b"), "a{{ x }}b");
  EXPECT_EQ(render("a {%- raw -%} {{ x }} {%- endraw -%} b", json::object(), plain_jinja()), "a{{ x }}b");
}

TEST(JinjaWhitespace, LstripOnlyAtLineStart) {
  EXPECT_EQ(render("x  {% if true %}y{% endif %}"), "x  y");
  EXPECT_EQ(render("x  {% if true %}y{% endif %}", json::object(), plain_jinja()), "x  y");
}

TEST(JinjaWhitespace, TabsAreIndent) {
  EXPECT_EQ(render("\t{% if true %}\n\tv{% endif %}"), "\tv");
  EXPECT_EQ(render("\t{% if true %}\n\tv{% endif %}", json::object(), plain_jinja()), "\t\n\tv");
}

TEST(JinjaWhitespace, HfDefaultsAreTheDefault) {
  jinja::ParseOptions options;
  EXPECT_TRUE(options.trim_blocks);
  EXPECT_TRUE(options.lstrip_blocks);
  EXPECT_FALSE(options.keep_trailing_newline);
  jinja::ParseOptions keep;
  keep.keep_trailing_newline = true;
  EXPECT_EQ(render("x\n", json::object(), keep), "x\n");
}

// ------------------------------------------------------------------ errors

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  std::string e = error_of("a\nb\n{{ 1 + }}");
  EXPECT_NE(e.find("syntax error at line 3, column 8"), std::string::npos) << e;
  e = error_of("{% if x %}never closed");
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  EXPECT_NE(e.find("'endif'"), std::string::npos) << e;
  e = error_of("{% for x in y %}{% endif %}");
  EXPECT_NE(e.find("endfor"), std::string::npos) << e;
  e = error_of("{{ 'unterminated }}");
  EXPECT_NE(e.find("unterminated string"), std::string::npos) << e;
  e = error_of("{# never closed");
  EXPECT_NE(e.find("comment"), std::string::npos) << e;
  e = error_of("{{ x ");
  EXPECT_NE(e.find("missing '}}'"), std::string::npos) << e;
  e = error_of("{% break %}");
  EXPECT_NE(e.find("outside of a loop"), std::string::npos) << e;
  e = error_of("{{ x is defined is none }}");
  EXPECT_NE(e.find("chain multiple tests"), std::string::npos) << e;
  e = error_of("{{ f(a=1, 2) }}");
  EXPECT_NE(e.find("positional argument follows keyword argument"), std::string::npos) << e;
  e = error_of("{% include 'other.jinja' %}");
  EXPECT_NE(e.find("not supported"), std::string::npos) << e;
  e = error_of("{% frobnicate %}");
  EXPECT_NE(e.find("unknown tag 'frobnicate'"), std::string::npos) << e;
  e = error_of("{{ 1 $ 2 }}");
  EXPECT_NE(e.find("unexpected character '$'"), std::string::npos) << e;
}

TEST(JinjaErrors, UnknownFilterOrTestFailsWhenItRuns) {
  // Not in a branch that never runs: Jinja2 3 renders those (a template may
  // guard a filter only newer Jinja2 versions have).
  EXPECT_EQ(render("{% if false %}{{ x|frobnicate }}{% endif %}ok"), "ok");
  EXPECT_EQ(render("{% if false %}{{ x is frobnicated }}{% endif %}ok"), "ok");
  EXPECT_EQ(render("{{ x|frobnicate if false else 'ok' }}"), "ok");
  std::string e = error_of("{{ x|frobnicate }}");
  EXPECT_NE(e.find("no filter named 'frobnicate'"), std::string::npos) << e;
  e = error_of("{{ x is frobnicated }}");
  EXPECT_NE(e.find("no test named 'frobnicated'"), std::string::npos) << e;
  e = error_of("{{ [1]|map('frobnicate')|list }}");
  EXPECT_NE(e.find("no filter named 'frobnicate'"), std::string::npos) << e;
}

// Found by a differential run against Jinja2 3.1.6 with transformers'
// tojson (session 47): each line is Jinja2's output.
TEST(JinjaPython, DifferencesFromJinja2Fixed) {
  // printf-style %s right-aligns (str.format's default is left).
  EXPECT_EQ(render("{{ '%5s|%-5s|%5d' % ('ab', 'cd', 7) }}"), "   ab|cd   |    7");
  // Python's float floor division and modulo (0.1 is a little over a tenth).
  EXPECT_EQ(render("{{ 2 // 0.1 }} {{ 1 // 0.1 }} {{ -1 // 0.1 }} {{ 7.5 // 2 }}"), "19.0 9.0 -10.0 3.0");
  EXPECT_EQ(render("{{ -0.0 % 7 }} {{ -7.5 % 2 }} {{ 7 % -2.5 }}"), "0.0 0.5 -0.5");
  // map / select / reject / selectattr / rejectattr of a falsy value: empty.
  EXPECT_EQ(render("{{ x|map(attribute='text')|list }}{{ x|selectattr('type', 'equalto', 'text')|list }}"
                   "{{ y|reject('none')|list }}",
                   {{"x", nullptr}, {"y", 0}}),
            "[][][]");
  // transformers' tojson(x, ensure_ascii=False, indent=None, ...): its
  // positional order, and string indents.
  EXPECT_EQ(render("{{ d|tojson(true) }}", {{"d", {{"a", "\u00e9"}}}}), "{\"a\": \"\\u00e9\"}");
  EXPECT_EQ(render("{{ d|tojson(false, 2) }}", {{"d", {{"a", 1}}}}), "{\n  \"a\": 1\n}");
  EXPECT_EQ(render("{{ d|tojson(indent='\t') }}", {{"d", {{"a", {1}}}}}), "{\n\t\"a\": [\n\t\t1\n\t]\n}");
  // loop.changed(*values): true on the first call and whenever they differ.
  EXPECT_EQ(render("{% for x in [1,1,2,2,1] %}{{ loop.changed(x) }} {% endfor %}"), "True False True False True ");
  EXPECT_EQ(render("{% for m in ms %}{% if loop.changed(m.role, m.n) %}[{{ m.role }}]{% endif %}{% endfor %}",
                   {{"ms", json::array({{{"role", "a"}, {"n", 1}}, {{"role", "a"}, {"n", 1}}, {{"role", "a"}, {"n", 2}}})}}),
            "[a][a]");
}

// JSON integers beyond int64 (up to 2^64 - 1) in the context stay exact, as
// Python's ints: a tool schema's uint64 maximum printed as a float changed
// the prompt of Llama 3.1's, Qwen3's and gpt-oss's templates.
TEST(JinjaPython, WideContextIntegersStayExact) {
  const json context = json::parse(R"({"a":{"id":18446744073709551615},"b":9223372036854775808,"s":[3,18446744073709551615,1]})");
  EXPECT_EQ(render("{{ a|tojson }}", context), "{\"id\": 18446744073709551615}");
  EXPECT_EQ(render("{{ a.id }} {{ a.id is integer }} {{ a.id > 5 }} {{ a.id == b }}", context),
            "18446744073709551615 True True False");
  EXPECT_EQ(render("{{ b|string }} {{ '{}'.format(b) }} {{ s|sort|list }} {{ s|max }} {{ b|float }}", context),
            "9223372036854775808 9223372036854775808 [1, 3, 18446744073709551615] 18446744073709551615 "
            "9.223372036854776e+18");
  EXPECT_NE(error_of("{{ b + 1 }}", context).find("integer overflow"), std::string::npos);
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplateMessage) {
  std::string e = error_of("{{ raise_exception('Conversation roles must alternate!') }}");
  EXPECT_NE(e.find("Conversation roles must alternate!"), std::string::npos) << e;
  e = error_of("{% if true %}{{ raise_exception('nope: ' ~ 42) }}{% endif %}");
  EXPECT_NE(e.find("nope: 42"), std::string::npos) << e;
}

TEST(JinjaErrors, RuntimeErrorsNameTheProblemAndPlace) {
  std::string e = error_of("line one\n{{ 'a' + 1 }}");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("can only concatenate str"), std::string::npos) << e;
  EXPECT_NE(error_of("{{ missing + 1 }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nope() }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + 2 ~ 3 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{% set d = {} %}{% set d.x = 1 %}").find("non-namespace"), std::string::npos);
  EXPECT_NE(error_of("{{ missing|tojson }}").find("not JSON serializable"), std::string::npos);
  EXPECT_NE(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").find("too many values to unpack"),
            std::string::npos);
  EXPECT_NE(error_of("{% for x in 5 %}{% endfor %}").find("not iterable"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' < 1 }}").find("not supported between"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc'.split('') }}").find("empty separator"), std::string::npos);
  EXPECT_NE(error_of("{{ [].pop() }}").find("pop from empty list"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ '%d' % 'x' }}").find("number is required"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x'|upper(1) }}").find("at most 0 argument"), std::string::npos);
}

TEST(JinjaErrors, ContextMustBeAnObject) {
  auto t = jinja::Template::parse("x");
  EXPECT_THROW(t.render(json::array({1, 2})), Error);
  EXPECT_EQ(t.render(json(nullptr)), "x");
  EXPECT_EQ(t.render(nlohmann::json{{"a", 1}}), "x");  // plain json converts
  auto greet = jinja::Template::parse("{{ who }}!");
  EXPECT_EQ(greet.render({{"who", "world"}}), "world!");  // braced init is not ambiguous
  nlohmann::json plain = {{"who", "json"}};
  EXPECT_EQ(greet.render(plain), "json!");
}

// ------------------------------------------------------------------ limits

jinja::RenderOptions small_limits() {
  jinja::RenderOptions options = fixed_clock();
  options.max_output_bytes = 1u << 20;
  options.max_steps = 500'000;
  return options;
}

TEST(JinjaLimits, InfiniteRecursionIsAnError) {
  std::string e = error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", json::object(), small_limits());
  EXPECT_NE(e.find("recursion"), std::string::npos) << e;
  e = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");  // default limits
  EXPECT_NE(e.find("recursion"), std::string::npos) << e;
}

TEST(JinjaLimits, ExponentialWorkIsAnError) {
  std::string e = error_of("{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
                           json::object(), small_limits());
  EXPECT_NE(e.find("work limit"), std::string::npos) << e;
  e = error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", json::object(),
               small_limits());
  EXPECT_NE(e.find("work limit"), std::string::npos) << e;
  e = error_of("{% for i in range(10**12) %}{% endfor %}");
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
}

TEST(JinjaLimits, HugeOutputIsAnError) {
  std::string e = error_of("{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}",
                           json::object(), small_limits());
  EXPECT_NE(e.find("exceeds the limit"), std::string::npos) << e;
  // Doubling a string in a loop is caught long before memory runs out.
  e = error_of("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               json::object(), small_limits());
  EXPECT_NE(e.find("exceeds the limit"), std::string::npos) << e;
  e = error_of("{{ 'x' * 10**12 }}");
  EXPECT_NE(e.find("exceeds the limit"), std::string::npos) << e;
  e = error_of("{{ 'xy' * 10**12 }}");
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
  e = error_of("{{ [1, 2] * 10**9 }}");
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
  e = error_of("{{ 'x'|center(10**12) }}");
  EXPECT_NE(e.find("exceeds the limit"), std::string::npos) << e;
}

TEST(JinjaLimits, DeepNestingIsAnErrorNotAStackOverflow) {
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_THROW(render("{{ " + std::string(100000, '(') + " }}"), Error);  // unbalanced: never finds '}}'
  EXPECT_THROW(render("{{ " + std::string(100000, '{') + " }}"), Error);
  EXPECT_THROW(render("{{ " + std::string(100000, '[') + " }}"), Error);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_NE(error_of(chain + " }}").find("expression too large"), std::string::npos);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|upper";
  EXPECT_THROW(render(filters + " }}"), Error);
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nested too deeply"), std::string::npos);
  std::string nots = "{{ " ;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_THROW(render(nots + "x }}"), Error);
}

TEST(JinjaLimits, DeepValuesAreSafe) {
  // 100k-deep nested list built at run time: using and freeing it must not
  // overflow the stack; printing it is refused.
  jinja::RenderOptions roomy = fixed_clock();
  std::string build =
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  EXPECT_EQ(jinja::Template::parse(build + "{{ ns.x|length }}").render(json::object(), roomy), "1");
  EXPECT_NE(error_of(build + "{{ ns.x }}", json::object(), roomy).find("nesting too deep"), std::string::npos);
  EXPECT_NE(error_of(build + "{{ ns.x|tojson }}", json::object(), roomy).find("nesting too deep"),
            std::string::npos);
  EXPECT_NE(error_of(build + "{{ ns.x == ns.x[0] }}", json::object(), roomy).find("nesting too deep"),
            std::string::npos);
  // Deeply nested input JSON is rejected cleanly too.
  // Parsed in one go: copying a deep nlohmann value would itself recurse.
  const std::string nested = "{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  nlohmann::json deep_plain = nlohmann::json::parse(nested);
  json deep_ordered = json::parse(nested);
  auto length = jinja::Template::parse("{{ x|length }}");
  EXPECT_THROW(length.render(deep_plain), Error);
  EXPECT_THROW(length.render(deep_ordered), Error);
}

TEST(JinjaLimits, ReferenceCyclesNeitherHangNorLeak) {
  const int64_t before = jinja::live_containers();
  EXPECT_NE(error_of("{% set l = [] %}{% do l.append(l) %}{{ l }}").find("nesting too deep"), std::string::npos);
  EXPECT_EQ(render("{% set l = [] %}{% do l.append(l) %}{{ l|length }} {{ l == l }}"), "1 True");
  EXPECT_EQ(render("{% set a = [] %}{% set b = [a] %}{% do a.append(b) %}{{ a|length }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.l = [ns] %}ok"), "ok");
  EXPECT_EQ(render("{% set d = {} %}{% do d.update({'d': d}) %}{{ d|length }}"), "1");
  EXPECT_EQ(render("{% set l = [] %}{% set f = l.append %}{% do l.append(f) %}{{ l|length }}"), "1");
  // A macro lives in the scope it closes over: a cycle in every template
  // that defines one.
  EXPECT_EQ(render("{% macro m() %}x{% endmacro %}{% for i in [1] %}{% macro n() %}{{ m() }}{% endmacro %}"
                   "{{ n() }}{% endfor %}"),
            "x");
  EXPECT_EQ(jinja::live_containers(), before);
}

TEST(JinjaLimits, RealTemplatesStayFarBelowTheStepLimit) {
  REPRISE_REQUIRE_SHARED(fixtures);
  // 400 messages with tool schemas through every fixture template with a
  // budget 50x smaller than the default.
  json messages = json::array();
  messages.push_back({{"role", "system"}, {"content", "Be brief."}});
  for (int i = 0; i < 200; ++i) {
    messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i)}});
    messages.push_back({{"role", "assistant"}, {"content", "Answer " + std::to_string(i)}});
  }
  messages.push_back({{"role", "user"}, {"content", "Last question"}});
  json tool = {{"type", "function"},
               {"function",
                {{"name", "get_weather"},
                 {"description", "Get the weather"},
                 {"parameters",
                  {{"type", "object"},
                   {"properties", {{"city", {{"type", "string"}, {"description", "City"}}}}},
                   {"required", {"city"}}}}}}};
  jinja::RenderOptions options = fixed_clock();
  options.max_steps = 100'000;
  for (const fs::path& path : fixture_templates(fixtures)) {
    ChatTemplate chat(read_file(path));
    ChatTemplateInputs inputs;
    inputs.messages = messages;
    inputs.tools = json::array({tool, tool, tool});
    std::string prompt;
    ASSERT_NO_THROW(prompt = chat.apply(inputs, options)) << path.filename();
    EXPECT_NE(prompt.find("Last question"), std::string::npos) << path.filename();
  }
}

// ------------------------------------------------------------- robustness

// Mutations of real templates and random garbage must either render or
// throw reprise::Error: no crash, no other exception, no hang.
TEST(JinjaRobustness, MutatedTemplatesRenderOrThrow) {
  REPRISE_REQUIRE_SHARED(fixtures);
  std::vector<std::string> corpus;
  for (const fs::path& path : fixture_templates(fixtures)) corpus.push_back(read_file(path));
  json convs = json::parse(read_file(fs::path(fixtures) / "templates" / "convs.json"));
  json context = {{"messages", convs[1]["messages"]}, {"add_generation_prompt", true}, {"bos_token", "<s>"},
                  {"eos_token", "</s>"}, {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}};
  jinja::RenderOptions options = fixed_clock();
  options.max_output_bytes = 256u << 10;
  options.max_steps = 100'000;

  // REPRISE_JINJA_FUZZ_SEED / _ITERATIONS run longer campaigns locally.
  auto env_or = [](const char* name, uint64_t fallback) {
    const char* v = std::getenv(name);
    return v ? std::strtoull(v, nullptr, 10) : fallback;
  };
  std::mt19937_64 rng(env_or("REPRISE_JINJA_FUZZ_SEED", 20261121));
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const std::string specials = "{}%#-+|()[]'\".,:=~*/!<>_ \n\tabcdefghijklmnopqrstuvwxyz0123456789";
  const std::vector<std::string> snippets = {"{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{% endfor %}",
                                             "{% endif %}", "{% for x in messages %}", "{% if x %}", "loop.",
                                             "|tojson", "|length", "(", ")", "[", "]", "'", "\"", "\\",
                                             "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "namespace(",
                                             "range(", "{% set ", " is ", " not ", " in ", "raise_exception(",
                                             "{% for i in range(100000) %}", "* 100000", "{% do ", ".append(",
                                             "{% call ", "{% filter upper %}", "{% raw %}", "{% endraw %}", "|map(",
                                             "|selectattr(", "ns.", "{% set ns = namespace(x=[]) %}", "[::-1]",
                                             "{%+", "\\u00e9", "\xc3", "\xff"};
  const auto start = std::chrono::steady_clock::now();
  int rendered = 0, rejected = 0;
  const int kIterations = static_cast<int>(env_or("REPRISE_JINJA_FUZZ_ITERATIONS", 3000));
  for (int iter = 0; iter < kIterations; ++iter) {
    std::string src;
    if (iter % 10 == 9) {
      size_t len = pick(300);
      for (size_t i = 0; i < len; ++i) {
        src += (iter % 20 == 9) ? static_cast<char>(rng()) : specials[pick(specials.size())];
      }
    } else {
      src = corpus[pick(corpus.size())];
      int mutations = 1 + static_cast<int>(pick(4));
      for (int m = 0; m < mutations && !src.empty(); ++m) {
        switch (pick(6)) {
          case 0: src[pick(src.size())] = specials[pick(specials.size())]; break;
          case 1: src[pick(src.size())] = static_cast<char>(rng()); break;
          case 2: src.resize(pick(src.size())); break;
          case 3: {
            const std::string& other = corpus[pick(corpus.size())];
            size_t from = pick(other.size()), len = pick(200);
            src.insert(pick(src.size()), other.substr(from, len));
            break;
          }
          case 4: src.insert(pick(src.size()), snippets[pick(snippets.size())]); break;
          case 5: {
            size_t from = pick(src.size()), len = pick(100);
            src.erase(from, len);
            break;
          }
        }
      }
    }
    try {
      auto t = jinja::Template::parse(src);
      t.render(context, options);
      ++rendered;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-reprise exception: " << e.what() << "\nsource:\n" << src;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ fuzz ] " << kIterations << " mutated templates: " << rendered << " rendered, " << rejected
            << " rejected with reprise::Error, " << seconds << " s\n";
  EXPECT_LT(seconds, 20.0 * kIterations / 3000);
  EXPECT_GT(rendered, 100);  // the mutations must not all be trivially broken
}

TEST(JinjaRobustness, OneTemplateRendersFromSeveralThreads) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ChatTemplate chat(fixture_template(fixtures, "openai-gpt-oss-120b"));
  ChatTemplateInputs inputs;
  inputs.messages = json::parse(read_file(fs::path(fixtures) / "templates" / "convs.json"))[1]["messages"];
  const std::string expected = chat.apply(inputs, fixed_clock());
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (chat.apply(inputs, fixed_clock()) != expected) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ------------------------------------------------------------ chat template

TEST(ChatTemplate, PassesToolsWithTheirKeyOrder) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ChatTemplate chat(fixture_template(fixtures, "Qwen-Qwen2.5-7B-Instruct"));
  ChatTemplateInputs inputs;
  inputs.messages = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
  inputs.tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
      "required": ["city"]}}}])");
  // Rendered by hand from the template (and checked with transformers' Jinja2 setup).
  EXPECT_EQ(chat.apply(inputs, fixed_clock()),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
            "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
            "signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\", \"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name\"}}, \"required\": "
            "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, ExtraContextAndThinkingSwitch) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ChatTemplate chat(fixture_template(fixtures, "Qwen-Qwen3-0.6B"));
  ChatTemplateInputs inputs;
  inputs.messages = json::array({{{"role", "user"}, {"content", "Hi"}},
                                 {{"role", "assistant"}, {"content", "<think>\nhmm\n</think>\n\nHello!"}},
                                 {{"role", "user"}, {"content", "Bye"}}});
  inputs.enable_thinking = false;
  const std::string expected =
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(chat.apply(inputs, fixed_clock()), expected);
  inputs.enable_thinking = true;
  inputs.extra_context = {{"enable_thinking", false}};  // extra_context wins
  EXPECT_EQ(chat.apply(inputs, fixed_clock()), expected);

  ChatTemplate oss(fixture_template(fixtures, "openai-gpt-oss-120b"));
  ChatTemplateInputs oss_inputs;
  oss_inputs.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  oss_inputs.extra_context = {{"reasoning_effort", "high"}};
  EXPECT_NE(oss.apply(oss_inputs, fixed_clock()).find("Reasoning: high\n"), std::string::npos);
}

TEST(ChatTemplate, ClockFeedsDates) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ChatTemplate llama(fixture_template(fixtures, "meta-llama-Llama-3.1-8B-Instruct"));
  ChatTemplateInputs inputs;
  inputs.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  jinja::RenderOptions options;
  options.now = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 4;
    tm.tm_hour = 12;
    tm.tm_isdst = -1;
    return std::mktime(&tm);
  };
  EXPECT_NE(llama.apply(inputs, options).find("Today Date: 04 Jul 2024\n"), std::string::npos);
}

TEST(ChatTemplate, FoldsSystemMessagesWhenTheTemplateRejectsThem) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ChatTemplate gemma(fixture_template(fixtures, "google-gemma-2-2b-it"));
  EXPECT_FALSE(gemma.supports_system_role());
  ChatTemplate qwen(fixture_template(fixtures, "Qwen-Qwen2.5-7B-Instruct"));
  EXPECT_TRUE(qwen.supports_system_role());

  ChatTemplateInputs inputs;
  inputs.messages = json::array({{{"role", "system"}, {"content", "A."}},
                                 {{"role", "system"}, {"content", "B."}},
                                 {{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(gemma.apply(inputs, fixed_clock()),
            "<start_of_turn>user\nA.\nB.\nHi<end_of_turn>\n<start_of_turn>model\n");
  inputs.messages = json::array({{{"role", "system"}, {"content", "Only system."}}});
  EXPECT_EQ(gemma.apply(inputs, fixed_clock()),
            "<start_of_turn>user\nOnly system.<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, TemplateErrorsSurfaceAsReprisError) {
  REPRISE_REQUIRE_SHARED(fixtures);
  ChatTemplate gemma(fixture_template(fixtures, "google-gemma-2-2b-it"));
  ChatTemplateInputs inputs;
  inputs.messages = json::array({{{"role", "assistant"}, {"content", "I speak first"}}});
  try {
    gemma.apply(inputs, fixed_clock());
    FAIL() << "expected reprise::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate user/assistant/user/assistant/..."),
              std::string::npos)
        << e.what();
  }
  inputs.messages = "not an array";
  EXPECT_THROW(gemma.apply(inputs), Error);
  EXPECT_THROW(ChatTemplate("{% if %}"), Error);
}

TEST(ChatTemplate, BosIsKeptUnlessTheTokenizerAddsIt) {
  ChatTemplate chat("{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}");
  ChatTemplateInputs inputs;
  inputs.messages = json::array({{{"role", "user"}, {"content", "x"}}});
  inputs.bos_token = "<s>";
  inputs.eos_token = "</s>";
  EXPECT_EQ(chat.apply(inputs), "<s>[x]</s>");
  inputs.tokenizer_adds_bos = true;
  EXPECT_EQ(chat.apply(inputs), "[x]</s>");
  EXPECT_EQ(chat.source(), "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}");
}

// -------------------------------------------------------- append stability

json multiturn_conversation(bool with_reasoning) {
  auto answer = [&](const std::string& thought, const std::string& text) {
    return with_reasoning ? "<think>\n" + thought + "\n</think>\n\n" + text : text;
  };
  return json::array({{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Name a color."}},
                      {{"role", "assistant"}, {"content", answer("Any color will do.", "Blue.")}},
                      {{"role", "user"}, {"content", "Another one?"}},
                      {{"role", "assistant"}, {"content", answer("A different one.", "Green.")}},
                      {{"role", "user"}, {"content", "And a third, please."}},
                      {{"role", "assistant"}, {"content", answer("Yet another.", "Red.")}},
                      {{"role", "user"}, {"content", "Thanks!"}}});
}

TEST(ChatTemplate, AppendStabilityReport) {
  REPRISE_REQUIRE_SHARED(fixtures);
  // Documented in docs/chat-templates.md; a change here means the doc (and
  // the prefix-cache expectations) need revisiting.
  struct Expectation {
    bool stable_plain, stable_reasoning;        // earlier turns never re-rendered
    bool continues_plain, continues_reasoning;  // replies continue the prompt
  };
  const std::map<std::string, Expectation> expected = {
      {"HuggingFaceTB-SmolLM3-3B", {true, true, true, true}},
      {"LFM2.5-Instruct", {true, false, true, false}},
      {"NVIDIA-Nemotron-Nano-v2", {false, false, true, true}},
      {"Qwen-Qwen2.5-7B-Instruct", {true, true, true, true}},
      {"Qwen-Qwen3-0.6B", {false, false, true, true}},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", {true, true, false, false}},
      {"google-gemma-2-2b-it", {true, true, true, true}},
      {"ibm-granite-granite-3.3-2B-Instruct", {true, true, true, true}},
      {"meta-llama-Llama-3.1-8B-Instruct", {true, true, true, true}},
      {"microsoft-Phi-3.5-mini-instruct", {true, true, true, true}},
      {"mistralai-Mistral-Nemo-Instruct-2407", {true, true, false, false}},
      {"openai-gpt-oss-120b", {false, false, true, true}},
  };
  auto describe = [](const AppendStability& s) {
    std::string out;
    if (!s.problem.empty()) return "error at message " + std::to_string(s.unstable_message) + ": " + s.problem;
    out += s.stable ? "history stable"
                    : "history re-rendered after message " + std::to_string(s.unstable_message) + " (byte " +
                          std::to_string(s.divergence_offset) + ")";
    out += s.prompt_continues ? ", replies continue the prompt"
                              : ", reply " + std::to_string(s.prompt_message) + " diverges from its prompt at byte " +
                                    std::to_string(s.prompt_divergence) + " of " + std::to_string(s.prompt_length);
    return out;
  };
  for (const fs::path& path : fixture_templates(fixtures)) {
    ChatTemplate chat(read_file(path));
    AppendStability plain = check_append_stability(chat, multiturn_conversation(false), {}, fixed_clock());
    AppendStability reasoning = check_append_stability(chat, multiturn_conversation(true), {}, fixed_clock());
    EXPECT_EQ(plain.stable, is_append_stable(chat, multiturn_conversation(false)));
    std::string name = path.stem().string();
    std::cout << "[ append-stability ] " << name << "\n    plain:     " << describe(plain)
              << "\n    reasoning: " << describe(reasoning) << "\n";
    auto it = expected.find(name);
    if (it == expected.end()) continue;
    EXPECT_EQ(plain.stable, it->second.stable_plain) << name;
    EXPECT_EQ(reasoning.stable, it->second.stable_reasoning) << name;
    EXPECT_EQ(plain.prompt_continues, it->second.continues_plain) << name;
    EXPECT_EQ(reasoning.prompt_continues, it->second.continues_reasoning) << name;
  }
}

TEST(ChatTemplate, AppendStabilityOnSimpleTemplates) {
  ChatTemplate stable("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}");
  json conv = json::array({{{"role", "user"}, {"content", "a"}},
                           {{"role", "assistant"}, {"content", "b"}},
                           {{"role", "user"}, {"content", "c"}}});
  EXPECT_TRUE(is_append_stable(stable, conv));
  // Renders the last assistant turn differently from earlier ones.
  ChatTemplate unstable("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}");
  AppendStability result = check_append_stability(unstable, conv);
  EXPECT_FALSE(result.stable);
  EXPECT_EQ(result.unstable_message, 1u);
  EXPECT_EQ(result.divergence_offset, std::string("<user>a<assistant>b").size());
  EXPECT_FALSE(result.prompt_continues);  // "<user>a!" does not continue into "<user>a<assistant>b!"
  EXPECT_EQ(result.prompt_message, 1u);
  EXPECT_EQ(result.prompt_divergence, std::string("<user>a").size());
  EXPECT_EQ(result.prompt_length, std::string("<user>a!").size());
  EXPECT_TRUE(check_append_stability(stable, conv).prompt_continues);
}

}  // namespace
}  // namespace reprise
