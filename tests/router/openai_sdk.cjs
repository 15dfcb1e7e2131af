// tests/router/openai_sdk.cjs - the router's HTTP API through the real `openai` client of the
// npm registry (run by tests/router/test_http.c with NODE_PATH at its node_modules): a whole
// and a streamed chat completion, and a completion, all greedy; prints what it got as JSON.
// usage: SLUICE_URL=http://127.0.0.1:PORT [SLUICE_MODEL=ID] node openai_sdk.cjs
'use strict';
const { OpenAI } = require('openai');

async function main() {
    const client = new OpenAI({
        baseURL: process.env.SLUICE_URL + '/v1',
        apiKey: process.env.SLUICE_KEY || 'unused',
        maxRetries: 0,
    });
    const messages = [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'Tell me a story.' },
    ];
    const models = await client.models.list();
    const model = process.env.SLUICE_MODEL || models.data[0].id;
    const whole = await client.chat.completions.create({
        model, messages, max_tokens: 10, temperature: 0,
    });
    let streamed = '';
    let finish = null;
    const stream = await client.chat.completions.create({
        model, messages, max_tokens: 10, temperature: 0, stream: true,
    });
    for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (c && c.delta && typeof c.delta.content === 'string')
            streamed += c.delta.content;
        if (c && c.finish_reason)
            finish = c.finish_reason;
    }
    const completion = await client.completions.create({
        model, prompt: 'hello world', max_tokens: 8, temperature: 0,
    });
    let notFound = null;
    try {
        await client.chat.completions.create({ model: 'no-such-model', messages });
    } catch (e) {
        notFound = { status: e.status, code: e.code };
    }
    console.log(JSON.stringify({
        models: models.data.map((m) => m.id),
        whole: whole.choices[0].message.content,
        whole_finish: whole.choices[0].finish_reason,
        usage: whole.usage,
        streamed,
        stream_finish: finish,
        completion: completion.choices[0].text,
        not_found: notFound,
    }));
}

main().catch((e) => {
    console.error('openai_sdk: ' + (e && e.message ? e.message : e));
    process.exit(1);
});
