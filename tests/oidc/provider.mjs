// A real OpenID provider for the tests: npm `oidc-provider` (the certified Node.js implementation),
// run on 127.0.0.1. Environment:
//   OIDC_NODE_MODULES  the node_modules directory holding oidc-provider (tests/oidc/install.sh)
//   OIDC_PORT          port to listen on (127.0.0.1)
//   OIDC_KEYS          comma-separated PEM private keys (RSA -> RS256, EC P-256 -> ES256); the
//                      kid of each is its file name without .pem. The first RSA key signs ID tokens.
// Access tokens are JWTs for a resource indicator (RFC 8707): urn:ctxguard:rs (RS256),
// urn:ctxguard:es (ES256), urn:other (RS256, for a wrong audience), and any http://127.0.0.1 URL
// (an MCP server, ES256). Tenant and roles sit where many providers put them:
//   "https://ctxguard.test/tenant": "<tenant>"   (a namespaced claim, its name full of dots)
//   "realm_access": {"roles": [...]}             (Keycloak's shape)
// Users sign in and consent through /interaction/<uid> forms that a scripted browser submits.
// Prints "ready <issuer>" on stdout once listening.
import { createPrivateKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const { default: Provider } = await import(
  pathToFileURL(`${process.env.OIDC_NODE_MODULES}/oidc-provider/lib/index.js`).href
);

const port = Number(process.env.OIDC_PORT);
const issuer = `http://127.0.0.1:${port}`;
const keys = process.env.OIDC_KEYS.split(',').filter(Boolean).map((path) => {
  const jwk = createPrivateKey(readFileSync(path)).export({ format: 'jwk' });
  return { ...jwk, kid: basename(path, '.pem'), use: 'sig', alg: jwk.kty === 'RSA' ? 'RS256' : 'ES256' };
});

// Who is who: users (authorization code flow) and service clients (client credentials).
const TENANTS = {
  alice: { tenant: 'acme', roles: ['ap_clerk'] },
  'svc-acme': { tenant: 'acme', roles: ['ap_clerk', 'viewer'] },
  'svc-bad-tenant': { tenant: 'not a valid id', roles: [] },
};

const resources = {
  'urn:ctxguard:rs': 'RS256',
  'urn:ctxguard:es': 'ES256',
  'urn:other': 'RS256',
};

const provider = new Provider(issuer, {
  jwks: { keys },
  clients: Object.keys(TENANTS)
    .filter((id) => id.startsWith('svc-'))
    .map((client_id) => ({
      client_id,
      client_secret: `${client_id}-secret`,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_post',
    })),
  cookies: { keys: ['ctxguard-test-cookie-key'] },
  findAccount: async (_ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  // The API's scope is known to the provider too, so clients may register with it.
  scopes: ['openid', 'offline_access', 'ctxguard'],
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    registration: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, resource) => {
        const alg = resources[resource] ?? (resource.startsWith('http://127.0.0.1:') ? 'ES256' : null);
        if (!alg) throw new Provider.errors.InvalidTarget();
        return { scope: 'ctxguard', audience: resource, accessTokenTTL: 600, accessTokenFormat: 'jwt', jwt: { sign: { alg } } };
      },
    },
  },
  extraTokenClaims: async (_ctx, token) => {
    const who = TENANTS[token.accountId ?? token.clientId];
    if (!who) return undefined;
    return { 'https://ctxguard.test/tenant': who.tenant, realm_access: { roles: who.roles } };
  },
  interactions: { url: async (_ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { ClientCredentials: 600, AccessToken: 600, Interaction: 600, Session: 3600, Grant: 3600, AuthorizationCode: 60 },
  pkce: { required: () => true },
});

const form = (uid, step, fields) => `<!doctype html><title>${step}</title>
<form method="post" action="/interaction/${uid}/${step}">${fields}<button>${step}</button></form>`;

async function interaction(req, res) {
  const [, , uid, step] = new URL(req.url, issuer).pathname.split('/');
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new Error('interaction mismatch');
  if (req.method === 'GET') {
    res.setHeader('content-type', 'text/html');
    res.end(details.prompt.name === 'login'
      ? form(uid, 'login', '<input name="login">')
      : form(uid, 'confirm', ''));
    return;
  }
  let body = '';
  for await (const chunk of req) body += chunk;
  if (step === 'login') {
    const login = new URLSearchParams(body).get('login');
    if (!TENANTS[login]) throw new Error('unknown user');
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
  } else if (step === 'confirm') {
    const { prompt: { details: missing }, params, session: { accountId } } = details;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId, clientId: params.client_id });
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    const grantId = await grant.save();
    await provider.interactionFinished(req, res, { consent: details.grantId ? {} : { grantId } }, { mergeWithLastSubmission: true });
  } else {
    res.statusCode = 404;
    res.end();
  }
}

const callback = provider.callback();
http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((e) => {
      console.error('interaction failed:', e.message);
      res.statusCode = 400;
      res.end('interaction failed');
    });
  } else {
    callback(req, res);
  }
}).listen(port, '127.0.0.1', () => console.log(`ready ${issuer}`));
