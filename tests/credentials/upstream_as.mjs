// The upstream's own authorization server for issue 33's tests: npm `oidc-provider` (as
// tests/oidc/provider.mjs), on 127.0.0.1. One confidential client, the gateway (`ctxguard-gw`):
// authorization code with PKCE, refresh tokens (rotated), revocation, and an RFC 8693
// token-exchange grant whose subject token is one of ctxguard's test tokens (HS256, the secret in
// IDP_SECRET_FILE: this AS trusts that identity provider). Access tokens are ES256 JWTs for a
// resource indicator (an http://127.0.0.1 URL: the upstream MCP server), with the user's tenant.
// Environment: OIDC_NODE_MODULES, AS_PORT, GW_CALLBACK, IDP_SECRET_FILE, AT_TTL (seconds).
// Users sign in and consent through /interaction/<uid> forms a scripted browser submits; the
// exchange refuses `mallory`. Prints "ready <issuer>" once listening.
import { createHmac, generateKeyPairSync, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const { default: Provider } = await import(
  pathToFileURL(`${process.env.OIDC_NODE_MODULES}/oidc-provider/lib/index.js`).href
);
const port = Number(process.env.AS_PORT);
const issuer = `http://127.0.0.1:${port}`;
const ttl = Number(process.env.AT_TTL ?? 600);
const idpSecret = readFileSync(process.env.IDP_SECRET_FILE, 'utf8').trim();
const USERS = { alice: 'acme', carol: 'globex', mallory: 'acme' };
const TE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const AT_TYPE = 'urn:ietf:params:oauth:token-type:access_token';

const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: `as-${Date.now()}`, use: 'sig', alg: 'ES256' };
const resourceInfo = (resource) => {
  if (!resource?.startsWith('http://127.0.0.1:')) throw new Provider.errors.InvalidTarget();
  return { scope: 'files', audience: resource, accessTokenTTL: ttl, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'ES256' } } };
};

const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  clients: [{
    client_id: 'ctxguard-gw',
    client_secret: 'gw-secret',
    grant_types: ['authorization_code', 'refresh_token', TE],
    redirect_uris: [process.env.GW_CALLBACK],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'ES256',
  }],
  cookies: { keys: ['ctxguard-test-upstream-cookie'] },
  findAccount: async (_ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  scopes: ['openid', 'offline_access', 'files'],
  features: {
    devInteractions: { enabled: false },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, resource) => resourceInfo(resource),
    },
  },
  issueRefreshToken: async () => true,
  rotateRefreshToken: true,
  extraTokenClaims: async (_ctx, token) => (USERS[token.accountId] ? { tenant: USERS[token.accountId] } : undefined),
  interactions: { url: async (_ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { AccessToken: ttl, RefreshToken: 3600, Interaction: 600, Session: 3600, Grant: 3600, AuthorizationCode: 60 },
  pkce: { required: () => true },
});

// RFC 8693: the subject token must be a valid ctxguard test token (HS256); the new token is for
// the requested resource, with the subject's own identity.
function verifySubject(token) {
  const [h, p, s] = String(token ?? '').split('.');
  if (!h || !p || !s) return null;
  const want = createHmac('sha256', idpSecret).update(`${h}.${p}`).digest();
  const got = Buffer.from(s, 'base64url');
  if (got.length !== want.length || !timingSafeEqual(got, want)) return null;
  const header = JSON.parse(Buffer.from(h, 'base64url'));
  const claims = JSON.parse(Buffer.from(p, 'base64url'));
  if (header.alg !== 'HS256' || !(claims.exp > Date.now() / 1000)) return null;
  return claims;
}
provider.registerGrantType(TE, async (ctx) => {
  const { params, client } = ctx.oidc;
  const claims = params.subject_token_type === AT_TYPE ? verifySubject(params.subject_token) : null;
  if (!claims || !USERS[claims.sub] || claims.sub === 'mallory') {
    throw new Provider.errors.InvalidGrant('the subject token is not accepted');
  }
  const token = new provider.AccessToken({ accountId: claims.sub, client, gty: 'token_exchange', scope: 'files' });
  token.resourceServer = new provider.ResourceServer(params.resource, resourceInfo(params.resource));
  const value = await token.save();
  console.log(`exchanged for ${claims.sub}`);
  ctx.body = { access_token: value, issued_token_type: AT_TYPE, token_type: 'Bearer', expires_in: token.expiration, scope: 'files' };
}, ['subject_token', 'subject_token_type', 'requested_token_type', 'audience', 'resource', 'scope'], ['resource', 'audience']);
provider.on('grant.success', (ctx) => console.log(`grant ${ctx.oidc.params.grant_type}`));

const form = (uid, step, fields) => `<!doctype html><title>${step}</title>
<form method="post" action="/interaction/${uid}/${step}">${fields}<button>${step}</button></form>`;

async function interaction(req, res) {
  const [, , uid, step] = new URL(req.url, issuer).pathname.split('/');
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new Error('interaction mismatch');
  if (req.method === 'GET') {
    res.setHeader('content-type', 'text/html');
    res.end(details.prompt.name === 'login' ? form(uid, 'login', '<input name="login">') : form(uid, 'confirm', ''));
    return;
  }
  let body = '';
  for await (const chunk of req) body += chunk;
  if (step === 'login') {
    const login = new URLSearchParams(body).get('login');
    if (!USERS[login]) throw new Error('unknown user');
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
  } else {
    const { prompt: { details: missing }, params, session: { accountId } } = details;
    const grant = details.grantId ? await provider.Grant.find(details.grantId) : new provider.Grant({ accountId, clientId: params.client_id });
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) grant.addResourceScope(indicator, scopes.join(' '));
    const grantId = await grant.save();
    await provider.interactionFinished(req, res, { consent: details.grantId ? {} : { grantId } }, { mergeWithLastSubmission: true });
  }
}

const callback = provider.callback();
http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((e) => { console.error('interaction failed:', e.message); res.statusCode = 400; res.end('interaction failed'); });
  } else {
    if (req.url.startsWith('/token/revocation')) res.on('finish', () => console.log(`revocation ${res.statusCode}`));
    callback(req, res);
  }
}).listen(port, '127.0.0.1', () => console.log(`ready ${issuer}`));
