// kube-proxy in nftables mode (its own `kube-proxy` tables), Weir on the nft iptables backend.
import { servicesSuite } from './scenarios.ts';

servicesSuite({ mode: 'nftables', backend: 'nft' });
