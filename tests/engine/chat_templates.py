"""Real chat templates with tool syntax, as the models' ``tokenizer_config.json`` ship them.

``QWEN25`` is Qwen2.5-Instruct's ``chat_template`` (Qwen/Qwen2.5-*-Instruct, public): tools in
``<tools>`` in the system message, calls as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n
</tool_call>``, tool results as ``<tool_response>`` in a user turn.

``LLAMA32`` is Llama 3.2 Instruct's ``chat_template`` (meta-llama/Llama-3.2-3B-Instruct's
tokenizer_config.json, as llama.cpp vendors it in models/templates/): tools as indented JSON in
the first user message, the call as the whole reply ``{"name": ..., "parameters": ...}``, one
per assistant message, tool results in the ``ipython`` role.
"""

from __future__ import annotations

QWEN25 = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# A conversation with tools (bounded arguments: a random model fills a free string to the cap)
# and what Hugging Face renders of it with QWEN25: ``transformers`` 5.24's
# ``render_jinja_template(conversations=[...], tools=[WEATHER, TIME], chat_template=QWEN25,
# add_generation_prompt=True)``, arguments as objects as Hugging Face takes them.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, in °C & <rounded>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}}}}
QUESTION = {"role": "user", "content": "Weather and time in Paris?"}
# the second turn as the openai client sends it: arguments as JSON text, content None
LOOP = [{"role": "system", "content": "Be brief."}, QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": "{\"zone\":\"CET\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 °C and sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "14:05"}]

FIRST_PROMPT = (
    "<|im_start|>system\n"
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "The weather in a'
    ' city, in °C & <rounded>", "parameters": {"type": "object", "properties": {"city": {"type'
    '": "string", "enum": ["Paris", "Lyon"]}}, "required": ["city"]}}}\n'
    '{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "p'
    'roperties": {"zone": {"enum": ["CET", "UTC"]}}}}}\n'
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <too"
    "l_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "Weather and time in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
LOOP_PROMPT = (
    "<|im_start|>system\n"
    "Be brief.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "The weather in a'
    ' city, in °C & <rounded>", "parameters": {"type": "object", "properties": {"city": {"type'
    '": "string", "enum": ["Paris", "Lyon"]}}, "required": ["city"]}}}\n'
    '{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "p'
    'roperties": {"zone": {"enum": ["CET", "UTC"]}}}}}\n'
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <too"
    "l_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "Weather and time in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_time", "arguments": {"zone": "CET"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "18 °C and sunny\n"
    "</tool_response>\n"
    "<tool_response>\n"
    "14:05\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


LLAMA32 = (
    '{{- bos_token }}\n'
    '{%- if custom_tools is defined %}\n'
    '    {%- set tools = custom_tools %}\n'
    '{%- endif %}\n'
    '{%- if not tools_in_user_message is defined %}\n'
    '    {%- set tools_in_user_message = true %}\n'
    '{%- endif %}\n'
    '{%- if not date_string is defined %}\n'
    '    {%- if strftime_now is defined %}\n'
    '        {%- set date_string = strftime_now("%d %b %Y") %}\n'
    '    {%- else %}\n'
    '        {%- set date_string = "26 Jul 2024" %}\n'
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- if not tools is defined %}\n'
    '    {%- set tools = none %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    '    {%- set messages = messages[1:] %}\n'
    '{%- else %}\n'
    '    {%- set system_message = "" %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- System message #}\n'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
    '{%- if tools is not none %}\n'
    '    {{- "Environment: ipython\\n" }}\n'
    '{%- endif %}\n'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
    '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
    '{%- if tools is not none and not tools_in_user_message %}\n'
    '    {{- "You have access to the following functions. To call a function, please re'
    'spond with JSON for a function call." }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of'
    " argument name and its value}.' }}\n"
    '    {{- "Do not use variables.\\n\\n" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endfor %}\n'
    '{%- endif %}\n'
    '{{- system_message }}\n'
    '{{- "<|eot_id|>" }}\n'
    '\n'
    '{#- Custom tools are passed in a user message with some extra guidance #}\n'
    '{%- if tools_in_user_message and not tools is none %}\n'
    '    {#- Extract the first user message so we can plug it in here #}\n'
    '    {%- if messages | length != 0 %}\n'
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    '        {%- set messages = messages[1:] %}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Cannot put tools in the first user message when there'
    '\'s no first user message!") }}\n'
    '{%- endif %}\n'
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    '    {{- "Given the following functions, please respond with a JSON for a function '
    'call " }}\n'
    '    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of'
    " argument name and its value}.' }}\n"
    '    {{- "Do not use variables.\\n\\n" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endfor %}\n'
    '    {{- first_user_message + "<|eot_id|>"}}\n'
    '{%- endif %}\n'
    '\n'
    '{%- for message in messages %}\n'
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls"
    "' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ mes"
    "sage['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    '        {%- if not message.tool_calls|length == 1 %}\n'
    '            {{- raise_exception("This model only supports single tool-calls at once!") }}\n'
    '        {%- endif %}\n'
    '        {%- set tool_call = message.tool_calls[0].function %}\n'
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    '        {{- \'{"name": "\' + tool_call.name + \'", \' }}\n'
    '        {{- \'"parameters": \' }}\n'
    '        {{- tool_call.arguments | tojson }}\n'
    '        {{- "}" }}\n'
    '        {{- "<|eot_id|>" }}\n'
    '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
    '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
    '        {%- if message.content is mapping or message.content is iterable %}\n'
    '            {{- message.content | tojson }}\n'
    '        {%- else %}\n'
    '            {{- message.content }}\n'
    '        {%- endif %}\n'
    '        {{- "<|eot_id|>" }}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    '{%- endif %}\n'
)

# A Llama 3.2 conversation (one call: the template refuses more) and what Hugging Face renders of
# it with LLAMA32: ``transformers`` 5.24's ``render_jinja_template(conversations=[...],
# tools=[WEATHER, TIME], chat_template=LLAMA32, add_generation_prompt=True,
# bos_token="<|begin_of_text|>", date_string=LLAMA_DATE)``. meshd renders today's date
# (the template's ``strftime_now``): ``dated`` puts it in.
LLAMA_DATE = "29 Nov 2026"
LLAMA_LOOP = [{"role": "system", "content": "Be brief."}, QUESTION,
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "18 °C and sunny"}]

LLAMA_FIRST_PROMPT = (
    '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n'
    '\n'
    'Environment: ipython\n'
    'Cutting Knowledge Date: December 2023\n'
    'Today Date: 29 Nov 2026\n'
    '\n'
    '<|eot_id|><|start_header_id|>user<|end_header_id|>\n'
    '\n'
    'Given the following functions, please respond with a JSON for a function call wi'
    'th its proper arguments that best answers the given prompt.\n'
    '\n'
    'Respond in the format {"name": function name, "parameters": dictionary of argume'
    'nt name and its value}.Do not use variables.\n'
    '\n'
    '{\n'
    '    "type": "function",\n'
    '    "function": {\n'
    '        "name": "get_weather",\n'
    '        "description": "The weather in a city, in °C & <rounded>",\n'
    '        "parameters": {\n'
    '            "type": "object",\n'
    '            "properties": {\n'
    '                "city": {\n'
    '                    "type": "string",\n'
    '                    "enum": [\n'
    '                        "Paris",\n'
    '                        "Lyon"\n'
    '                    ]\n'
    '                }\n'
    '            },\n'
    '            "required": [\n'
    '                "city"\n'
    '            ]\n'
    '        }\n'
    '    }\n'
    '}\n'
    '\n'
    '{\n'
    '    "type": "function",\n'
    '    "function": {\n'
    '        "name": "get_time",\n'
    '        "parameters": {\n'
    '            "type": "object",\n'
    '            "properties": {\n'
    '                "zone": {\n'
    '                    "enum": [\n'
    '                        "CET",\n'
    '                        "UTC"\n'
    '                    ]\n'
    '                }\n'
    '            }\n'
    '        }\n'
    '    }\n'
    '}\n'
    '\n'
    'Weather and time in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
    '\n'
)
LLAMA_LOOP_PROMPT = (
    '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n'
    '\n'
    'Environment: ipython\n'
    'Cutting Knowledge Date: December 2023\n'
    'Today Date: 29 Nov 2026\n'
    '\n'
    'Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n'
    '\n'
    'Given the following functions, please respond with a JSON for a function call wi'
    'th its proper arguments that best answers the given prompt.\n'
    '\n'
    'Respond in the format {"name": function name, "parameters": dictionary of argume'
    'nt name and its value}.Do not use variables.\n'
    '\n'
    '{\n'
    '    "type": "function",\n'
    '    "function": {\n'
    '        "name": "get_weather",\n'
    '        "description": "The weather in a city, in °C & <rounded>",\n'
    '        "parameters": {\n'
    '            "type": "object",\n'
    '            "properties": {\n'
    '                "city": {\n'
    '                    "type": "string",\n'
    '                    "enum": [\n'
    '                        "Paris",\n'
    '                        "Lyon"\n'
    '                    ]\n'
    '                }\n'
    '            },\n'
    '            "required": [\n'
    '                "city"\n'
    '            ]\n'
    '        }\n'
    '    }\n'
    '}\n'
    '\n'
    '{\n'
    '    "type": "function",\n'
    '    "function": {\n'
    '        "name": "get_time",\n'
    '        "parameters": {\n'
    '            "type": "object",\n'
    '            "properties": {\n'
    '                "zone": {\n'
    '                    "enum": [\n'
    '                        "CET",\n'
    '                        "UTC"\n'
    '                    ]\n'
    '                }\n'
    '            }\n'
    '        }\n'
    '    }\n'
    '}\n'
    '\n'
    'Weather and time in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
    '\n'
    '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|><|start_header'
    '_id|>ipython<|end_header_id|>\n'
    '\n'
    '"18 °C and sunny"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
    '\n'
)


def dated(prompt: str) -> str:
    """A Llama 3.2 prompt above with today's date, as the template writes it."""
    import datetime

    return prompt.replace(f"Today Date: {LLAMA_DATE}",
                          "Today Date: " + datetime.datetime.now().strftime("%d %b %Y"))
