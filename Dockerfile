# Weir agent image: Node.js 24 on Debian with iptables (nft and legacy) and ipset.
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
# The image's own Node 24 builds; the 'node' dev dependency is only for machines without it.
RUN npm ci --no-audit --no-fund --omit=optional
COPY src ./src
RUN npx tsc -p tsconfig.build.json && npm prune --omit=dev

FROM node:24-bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends iptables ipset conntrack \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY package.json ./
COPY examples ./examples
ENTRYPOINT ["node", "/app/dist/cli/main.js"]
CMD ["agent"]
