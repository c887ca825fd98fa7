"""Real chat templates with tool syntax, as the models' ``tokenizer_config.json`` ship them.

``QWEN25`` is Qwen2.5-Instruct's ``chat_template`` (Qwen/Qwen2.5-*-Instruct, public): tools in
``<tools>`` in the system message, calls as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n
</tool_call>``, tool results as ``<tool_response>`` in a user turn.
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
