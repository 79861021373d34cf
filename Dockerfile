# Weir agent image: Debian bookworm with both iptables backends, ipset, iproute2 and kmod, the
# Node 24 binary of the npm package 'node' that package-lock.json pins, and the app in /app: one
# bundled module built by scripts/build.ts (every dependency inside, no node_modules).
# scripts/image.sh builds the same image without Docker; test/image/spec.test.ts keeps the two in
# step (the Debian packages, where Node comes from, how the app is built, the entrypoint, cmd and
# working directory).
FROM node:24-bookworm-slim AS build
WORKDIR /src
COPY package.json package-lock.json ./
# Dev dependencies too: esbuild, and the 'node' package whose binary the image ships.
RUN npm ci --no-audit --no-fund
# That binary must be the one scripts/image.sh pins by sha256 (npm installs it from a package
# no lockfile pins by hash).
COPY scripts/image.sh ./scripts/
RUN scripts/image.sh check-node
COPY src ./src
COPY scripts/build.ts ./scripts/
RUN node_modules/node/bin/node scripts/build.ts /app/dist \
    && cp package.json /app/ \
    && install -D -m 755 node_modules/node/bin/node /out/usr/local/bin/node

FROM debian:bookworm-slim
# The packages of image/packages.
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables ipset conntrack iproute2 tcpdump kmod libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/usr/local/bin/node /usr/local/bin/node
WORKDIR /app
COPY --from=build /app ./
COPY examples ./examples
ENTRYPOINT ["node", "--max-semi-space-size=2", "--expose-gc", "/app/dist/cli/main.js"]
CMD ["agent"]
