// kube-proxy in iptables mode on the nft iptables backend (Debian's default), Weir on the same.
import { servicesSuite } from './scenarios.ts';

servicesSuite({ mode: 'iptables', backend: 'nft' });
